"""The options stage 12 adds (declared once, here; plumbing/options.py): how many ranks share the
model, and which collectives library joins them."""
from l11_spec_decode.options import ENGINE_OPTIONS as BEFORE
from plumbing.options import Option, positive

OPTIONS = (
    Option("tensor_parallel_size", 1, "ranks (processes; GPUs on cuda) that each hold a slice of every layer "
           "(vLLM's name; 1: one process, the engine as it was)", "parallel", "tensor_parallel",
           check=positive("tensor_parallel_size")),
    Option("distributed_backend", "auto", "the collectives between ranks: nccl (GPUs) or gloo (CPU); auto: nccl on "
           "cuda, gloo on cpu", "parallel", "tensor_parallel", choices=("auto", "nccl", "gloo")),
    Option("disable_custom_all_reduce", False, "all-reduces by NCCL only (vLLM's name); default: ours, a Triton "
           "kernel over peer GPU memory, for messages up to 2 MiB (allreduce.py)", "parallel", "tensor_parallel"),
)

ENGINE_OPTIONS = BEFORE + OPTIONS            # the options of the engine up to this stage
