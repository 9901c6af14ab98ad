"""Cluster occupancy two ways on this GPU: cutlass's HardwareInfo.get_max_active_clusters (it
cute.compiles an empty kernel to ask the driver) and the PTX-built empty kernel a serving
process asks instead (kernels/recorded/hardware.py), for cluster sizes 1 to 16, with the time
of each. Writes JSON.

    python benchmarks/occupancy_probe.py --out occupancy.json
"""

import json
import time

import click


@click.command()
@click.option("--out", type=click.Path(dir_okay=False), required=True)
def main(out):
    import torch
    from cutlass.utils.hardware_info import HardwareInfo

    from cute_aot.kernels.recorded import hardware

    torch.cuda.init()
    torch.empty(1, device="cuda")  # the primary context current, as in a server
    info = HardwareInfo(0)
    rows = []
    for size in (1, 2, 4, 8, 16):
        started = time.perf_counter()
        theirs = info.get_max_active_clusters(size)
        middle = time.perf_counter()
        ours = hardware._max_active_clusters(int(info.device), size)
        rows.append(
            {
                "cluster_size": size,
                "cutlass": theirs,
                "ptx_probe": ours,
                "same": theirs == ours,
                "cutlass_s": round(middle - started, 4),
                "ptx_probe_s": round(time.perf_counter() - middle, 4),
            }
        )
    result = {
        "gpu": torch.cuda.get_device_name(),
        "rows": rows,
        "all_same": all(row["same"] for row in rows),
    }
    print(json.dumps(result))
    with open(out, "w") as file:
        json.dump(result, file, indent=1)


if __name__ == "__main__":
    main()
