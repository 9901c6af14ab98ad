# What tests/test_one_home.py must flag (lines ending in "read") and let through (writes).
import os

a = os.environ.get("A")  # read
b = os.getenv("B")  # read
c = "C" in os.environ  # read
d = dict(os.environ)  # read
os.environ["E"] = "1"
os.environ.update(F="1")
os.environ.pop("G", None)
del os.environ["E"]
