"""What `aot-cache` shows, as data: no click, no rich; the commands present it."""
