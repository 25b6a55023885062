"""The GPU side shared by CUDA and Vulkan, as pure functions: what a container is given, the devices an image
sees, the device llama.cpp is told to use, and what the server's load lines say (no Docker here; the real image,
lavapipe and llama-server are in tests/test_vulkan.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from harness import KitError
from harness.hosts import devices
from harness.hosts.engine import container_options
from harness.image import backends
from harness.intake import manifest as mf
from harness.run import serverlog
from tests.conftest import DEMO, write_manifest

#: specbench-vulkan-devices' output in the Vulkan image on a machine without a GPU (trixie's Mesa 25.0.7).
LAVAPIPE = json.dumps({"kind": "vulkan-devices", "instance_version": "1.4.309", "devices": [{
    "index": 0, "name": "llvmpipe (LLVM 19.1.7, 256 bits)", "type": "cpu", "vendor_id": 65541, "device_id": 0,
    "api_version": "1.4.305", "driver_id": 13, "driver_name": "llvmpipe",
    "driver_info": "Mesa 25.0.7-2+deb13u1 (LLVM 19.1.7)", "heaps": [{"bytes": 25276071936, "device_local": True}],
    "device_local_bytes": 25276071936, "host_visible_device_local": True}]})
#: The same with an integrated AMD GPU as RADV shows one (a Strix Halo-like host).
WITH_IGPU = json.dumps({"kind": "vulkan-devices", "devices": [
    {"index": 0, "name": "AMD Radeon Graphics (RADV GFX1151)", "type": "integrated-gpu", "driver_id": 3,
     "driver_name": "radv", "driver_info": "Mesa 25.0.7", "device_local_bytes": 103079215104},
    json.loads(LAVAPIPE)["devices"][0] | {"index": 1}]})


def test_lavapipe_is_named_a_software_device_with_unified_memory():
    (d,) = devices.parse_vulkan_devices(LAVAPIPE)
    assert d.software == "Mesa lavapipe" and d.unified is True and d.kind == "cpu"
    line = d.line()
    assert line.startswith("Vulkan 0: llvmpipe (LLVM 19.1.7, 256 bits), driver llvmpipe (Mesa 25.0.7")
    assert "23.5 GiB" in line and "unified memory" in line and "SOFTWARE device (Mesa lavapipe" in line
    gpu, soft = devices.parse_vulkan_devices(WITH_IGPU)
    assert gpu.software is None and gpu.unified is True and "integrated gpu" in gpu.line()
    assert "SOFTWARE" not in gpu.line() and soft.software


def test_no_driver_is_no_device_and_garbage_is_one_line():
    assert devices.parse_vulkan_devices('{"kind": "vulkan-devices", "devices": [], "error": "-9"}') == []
    with pytest.raises(KitError, match="expected one JSON line") as e:
        devices.parse_vulkan_devices("Segmentation fault")
    assert "\n" not in str(e.value)


def test_the_device_llama_cpp_is_told_to_use():
    soft_only = devices.parse_vulkan_devices(LAVAPIPE)
    both = devices.parse_vulkan_devices(WITH_IGPU)
    assert devices.choose(soft_only, software=True) == (0, None)
    index, problem = devices.choose(soft_only, software=False)
    assert index is None and "no Vulkan GPU" in problem and "hardware.software_device" in problem
    assert "\n" not in problem
    assert devices.choose(both, software=False) == (None, None)  # llama.cpp picks the GPU itself
    assert devices.choose(both, software=True) == (1, None)
    assert "no software Vulkan device" in devices.choose([both[0]], software=True)[1]


def test_what_a_container_is_given():
    cuda = devices.access_from_nodes(backends.get("cuda"), [])
    kw = container_options(cuda)
    assert kw["device_requests"][0]["Capabilities"] == [["gpu"]] and set(kw) == {"device_requests"}
    assert container_options(devices.access_from_nodes(backends.get("cpu"), [("/dev/dri/renderD128", 105)])) == {}
    # only the render nodes (and AMD's compute node) with their groups: not the display node card0, not /dev/dri
    nodes = [("/dev/dri/card0", 44), ("/dev/dri/renderD128", 105), ("/dev/kfd", 105),
             ("/dev/dri/by-path/pci-0000:c5:00.0-render", 105)]
    image_id = "sha256:" + "ab" * 32
    cache = {"volumes": {"specbench-mesa-shader-cache-abababababababab": {"bind": "/var/cache/specbench-mesa-shaders",
                                                                         "mode": "rw"}}}
    shaders = {"MESA_SHADER_CACHE_DIR": "/var/cache/specbench-mesa-shaders"}
    vk = devices.access_from_nodes(backends.get("vulkan"), nodes, image_id)
    assert container_options(vk) == {"devices": ["/dev/dri/renderD128:/dev/dri/renderD128:rwm",
                                                 "/dev/kfd:/dev/kfd:rwm"],
                                     "group_add": ["105"], "environment": shaders, **cache}
    soft = devices.access_from_nodes(backends.get("vulkan"), [], image_id).with_visible(0)
    assert container_options(soft) == {"environment": {**shaders, "GGML_VK_VISIBLE_DEVICES": "0"}, **cache}
    assert "no device nodes" in soft.describe() and "GGML_VK_VISIBLE_DEVICES=0" in soft.describe()
    assert container_options(soft.with_visible(None)) == {"environment": shaders, **cache}
    # the shader cache is the image's own: another image (another source, other flags) gets another volume
    other = devices.access_from_nodes(backends.get("vulkan"), nodes, "sha256:" + "cd" * 32)
    assert set(container_options(other)["volumes"]).isdisjoint(cache["volumes"])
    # a container that only lists devices (no image id given) gets no shader cache at all
    assert "volumes" not in container_options(devices.access_from_nodes(backends.get("vulkan"), nodes))


def test_nvidia_smi_gpus_become_devices_with_the_same_line():
    (gb10,) = devices.from_nvidia_smi([{"name": "NVIDIA GB10", "driver": "580.95", "memory_mib": None,
                                        "utilization_pct": 0.0}])
    assert gb10.unified is True and gb10.line().startswith("CUDA 0: NVIDIA GB10, driver NVIDIA 580.95")
    (h100,) = devices.from_nvidia_smi([{"name": "H100", "driver": "580", "memory_mib": 81559.0,
                                        "utilization_pct": 0.0}])
    assert h100.unified is None and h100.memory_bytes == 81559 * 2**20


#: llama-server b11434's load lines at -lv 4 on lavapipe (a target and its drafter, -ngl 999 -ngld 999), as
#: captured from the Vulkan image.
LOAD_LOG = "\n".join([
    '0.00.244.523 I llama_prepare_model_devices: using device Vulkan0 (llvmpipe (LLVM 19.1.7, 256 bits))'
    ' (unknown id) - 23162 MiB free',
    '0.00.250.969 I load_tensors: offloading output layer to GPU',
    '0.00.251.260 I load_tensors: offloading 3 repeating layers to GPU',
    '0.00.251.459 I load_tensors: offloaded 5/5 layers to GPU',
    '0.00.251.465 I load_tensors:   CPU_Mapped model buffer size =     0.41 MiB',
    '0.00.251.646 I load_tensors:      Vulkan0 model buffer size =    10.42 MiB',
    '0.00.268.838 I llama_context: Vulkan_Host  output buffer size =     0.01 MiB',
    '0.00.268.964 I llama_kv_cache:    Vulkan0 KV buffer size =     8.00 MiB',
    '0.00.314.614 I sched_reserve:    Vulkan0 compute buffer size =     6.01 MiB',
    '0.00.319.911 I sched_reserve: Vulkan_Host compute buffer size =     4.02 MiB',
    '0.00.837.803 I llama_prepare_model_devices: using device Vulkan0 (llvmpipe (LLVM 19.1.7, 256 bits))'
    ' (unknown id) - 23117 MiB free',
    '0.00.851.482 I load_tensors: offloading output layer to GPU',
    '0.00.851.872 I load_tensors: offloading 0 repeating layers to GPU',
    '0.00.852.065 I load_tensors: offloaded 2/2 layers to GPU',
    '0.00.852.246 I load_tensors:   CPU_Mapped model buffer size =     0.41 MiB',
    '0.00.852.460 I load_tensors:      Vulkan0 model buffer size =     2.91 MiB',
    '0.00.859.551 I llama_context: Vulkan_Host  output buffer size =     0.01 MiB',
    '0.00.859.843 I llama_kv_cache:    Vulkan0 KV buffer size =     2.00 MiB',
    '0.00.873.240 I sched_reserve:    Vulkan0 compute buffer size =     5.01 MiB',
    '0.00.873.241 I sched_reserve: Vulkan_Host compute buffer size =     4.02 MiB',
])


def test_load_lines_say_device_layers_and_device_memory():
    d = serverlog.devices(LOAD_LOG)
    target, draft = d["models"]
    assert target["device"] == "Vulkan0" and target["description"] == "llvmpipe (LLVM 19.1.7, 256 bits)"
    assert (target["layers_offloaded"], target["layers"], draft["layers_offloaded"], draft["layers"]) == (5, 5, 2, 2)
    assert d["device_buffers_mib"] == {"Vulkan0": {"model": 13.33, "kv": 10.0, "compute": 11.02}}
    assert d["device_mib"] == pytest.approx(34.35)  # host buffers (CPU_Mapped, Vulkan_Host) are not device memory
    assert serverlog.devices("0.00.001.000 I main: loading model\n") is None  # a CPU build names no device


def test_software_device_needs_the_vulkan_backend(tmp_path):
    raw = yaml.safe_load(DEMO.read_text())
    raw["hardware"]["software_device"] = True
    with pytest.raises(mf.ManifestError, match=r"build.backend: expected 'vulkan', got 'cpu'"):
        mf.load(write_manifest(tmp_path, yaml.safe_dump(raw)))
    raw["build"]["backend"] = "vulkan"
    assert mf.load(write_manifest(tmp_path, yaml.safe_dump(raw))).hardware.software_device is True
