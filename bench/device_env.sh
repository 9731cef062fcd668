# Sourced by the device scripts (bench/gpu_check.sh, bench/gpu_train.sh) from the repository root:
# the tree on PYTHONPATH (the package need not be installed), unbuffered output, and
# device_report, which prints the machine's versions and fails (status 2) when DEVICE=cuda and
# torch sees no CUDA device.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
DEVICE="${DEVICE:-cuda}"

device_report() {
  python3 -c 'import importlib, os, platform, torch
def version(name):
    try:
        return importlib.import_module(name).__version__
    except ImportError:
        return "absent"
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| numpy", version("numpy"), "| onnx", version("onnx"), "| onnxruntime", version("onnxruntime"))
print("gpu:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none", "| cpus:", os.cpu_count())' || return 2
  if [ "$DEVICE" = "cuda" ]; then
    if ! python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
      echo "no CUDA device visible to torch"; return 2
    fi
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  fi
  return 0
}
