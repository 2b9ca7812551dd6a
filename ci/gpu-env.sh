# Sourced by ci/gpu-job.sh and ci/gpu-smoke.sh: check the driver and the Python
# environment for the GPU-marked properties, one line per problem.
#   sets: GPUS (GPUs nvidia-smi lists), PY (the interpreter to run pytest with)
gpu_say() { printf '%s: %s\n' "${GPU_SCRIPT:-ci/gpu}" "$*"; }
gpu_die() { gpu_say "$*" >&2; exit 1; }

gpu_check_driver() {
  command -v nvidia-smi >/dev/null 2>&1 || gpu_die "no nvidia-smi on PATH: this machine has no NVIDIA driver"
  local q
  q=$(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1) \
    || gpu_die "nvidia-smi failed, the driver does not answer: $q"
  GPUS=$(printf '%s\n' "$q" | grep -c .)
  [ "$GPUS" -gt 0 ] || gpu_die "nvidia-smi lists no GPU"
  gpu_say "driver: $GPUS GPU(s)"
  printf '%s\n' "$q" | sed 's/^/  /'
}

gpu_check_python() {
  # torch must be a CUDA build that sees the GPUs; lmcache and the suite's pins must import
  "$PY" - "$GPUS" <<'PY' || gpu_die "the Python environment at $PY cannot run the GPU properties (above)"
import sys
want = int(sys.argv[1])
try:
    import torch
except ImportError:
    sys.exit("no torch: run TORCH_BUILD=cuda ci/setup.sh, or point GPU_PYTHON at an environment that has it")
if not torch.version.cuda:
    sys.exit(f"torch {torch.__version__} is a CPU build")
n = torch.cuda.device_count() if torch.cuda.is_available() else 0
if n == 0:
    sys.exit(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU: driver too old for this CUDA?")
if n != want:
    print(f"note: torch sees {n} GPU(s), nvidia-smi lists {want} (CUDA_VISIBLE_DEVICES?)")
from fixtures.compat import preflight
bad = preflight.problems(preflight.CORE)
if bad:
    sys.exit("; ".join(bad))
print(f"torch {torch.__version__} CUDA {torch.version.cuda}, {n} GPU(s): "
      + ", ".join(torch.cuda.get_device_name(i) for i in range(n)))
PY
}
