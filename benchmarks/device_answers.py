"""What a real GPU answers to the questions a virtual one must answer (kernels/gpu_profiles.json):
every CUdevice_attribute cuDeviceGetAttribute knows, torch's device properties, the driver
version, the memory size and cutlass's cluster occupancy per cluster size. Run on the GPU:

    python benchmarks/device_answers.py --out results/h200_device_answers.json
    python benchmarks/device_answers.py --compare results/h200_device_answers.json --profile h200

--compare says, for a profile, every answer it holds that the device gave otherwise (and what
the device answered that the profile lacks), on any machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

CLUSTER_SIZES = (1, 2, 4, 8, 16)


def read_device() -> dict:
    import torch
    from cuda.bindings import driver

    torch.zeros(1, device="cuda")  # the primary context, as a workload has it
    ok = driver.CUresult.CUDA_SUCCESS
    err, device = driver.cuDeviceGet(torch.cuda.current_device())
    attributes = {}
    for attribute in driver.CUdevice_attribute:
        err, value = driver.cuDeviceGetAttribute(attribute, device)
        if err == ok:
            attributes[attribute.name.removeprefix("CU_DEVICE_ATTRIBUTE_")] = int(value)
    props = torch.cuda.get_device_properties(device=torch.cuda.current_device())
    properties = {
        name: getattr(props, name)
        for name in dir(props)
        if not name.startswith("_") and isinstance(getattr(props, name), (int, str))
    }
    from cutlass.utils import HardwareInfo

    info = HardwareInfo()
    return {
        "name": torch.cuda.get_device_name(),
        "driver_version": driver.cuDriverGetVersion()[1],
        "total_memory": int(driver.cuDeviceTotalMem(device)[1]),
        "attributes": attributes,
        "max_active_clusters": {str(c): info.get_max_active_clusters(c) for c in CLUSTER_SIZES},
        "torch_properties": properties,
        "torch": torch.__version__,
    }


def differences(read: dict, profile) -> dict:
    """answer -> [profile's, device's] where they differ; missing: what the profile lacks."""
    differ, missing = {}, []
    for name, value in read["attributes"].items():
        if name not in profile.attributes:
            missing.append(name)
        elif profile.attributes[name] != value:
            differ[name] = [profile.attributes[name], value]
    for size, value in read["max_active_clusters"].items():
        held = profile.max_active_clusters.get(int(size))
        if held is None:
            missing.append(f"max_active_clusters({size})")
        elif held != value:
            differ[f"max_active_clusters({size})"] = [held, value]
    if profile.device_name != read["name"]:
        differ["name"] = [profile.device_name, read["name"]]
    return {"differ": differ, "missing": missing}


@click.command()
@click.option("--out", type=click.Path(path_type=Path))
@click.option("--compare", "compare_file", type=click.Path(exists=True, path_type=Path))
@click.option("--profile", "profile_name", default="h200", show_default=True)
def main(out, compare_file, profile_name):
    if compare_file:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from cute_aot.kernels.gpu_profiles import profile

        print(
            json.dumps(
                differences(json.loads(compare_file.read_text()), profile(profile_name)), indent=1
            )
        )
        return
    read = read_device()
    text = json.dumps(read, indent=1, sort_keys=True)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
