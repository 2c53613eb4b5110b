"""The options stage 12 adds (declared once, here; plumbing/options.py): how many ranks share the
model, which collectives library joins them, and how many replicas of the whole engine a server
runs (data parallelism: ``python -m l10_server --data-parallel-size 2``), routed how."""
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
    Option("data_parallel_size", 1, "replicas of the whole engine behind one server, each an engine core process "
           "with its own GPU(s) (vLLM's name; the server's option: LLM(...) runs one engine)", "parallel",
           "engine_client", check=positive("data_parallel_size")),
    Option("data_parallel_routing", "least_loaded", "which replica takes a request: least_loaded (the fewest in "
           "flight, vLLM's) or prefix (the replica its first block's tokens hash to, unless it is far busier)",
           "parallel", "engine_client", choices=("least_loaded", "prefix")),
)

ENGINE_OPTIONS = BEFORE + OPTIONS            # the options of the engine up to this stage
