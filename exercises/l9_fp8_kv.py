"""Lesson 9, build it: quantize K or V to e4m3 with a scale.

Replace the stub below with your own ``quantize_kv``, then run

    python scripts/exercise.py l9

which runs the project's tests with ``LESSONS_LEARNER=l9``: stage 9's torch path then calls your
function wherever it writes K/V into the cache (``Fp8KVCache.set_kv``, l9_fp8_kv/cache.py), the
reference the fused write kernel is checked against, and the path scripts/l9_accuracy.py
measures against Hugging Face.

Contract
    x       [T, H, D]  float tensor (the model's dtype)
    scale   [T, H] float32 (per tensor: the layer's value, broadcast), or None: per token and head
    ->      (codes [T, H, D] torch.float8_e4m3fn, scale [T, H] float32)

With ``scale=None`` each (token, head) gets scale = amax(|x|) / 448 over its D values (1.0 for
an all-zero vector). Then codes = e4m3(clamp(x / scale, -448, 448)), division and clamp in
float32, and ``.to(torch.float8_e4m3fn)`` rounds to nearest even. Examples:
    x [[[3.0, -6.0, 1.5, 0.75]]], None       -> codes [224, -448, 112, 56], scale [[6 / 448]]
    x [[[1000.0, 0.5]]], torch.ones(1, 1)    -> codes [448, 0.5], scale [[1.0]]   (clamped, never NaN)
"""


def quantize_kv(x, scale):
    raise NotImplementedError("quantize_kv: scale = amax / 448 per (token, head) when none is given; "
                              "codes = clamp(x / scale, -448, 448) cast to torch.float8_e4m3fn")


# The project tests that check your function (scripts/exercise.py runs exactly these).
TESTS = [
    "tests/test_l9_kernel.py::test_l9_quantize_kv_saturates_rounds_and_scales",
    "tests/test_l9_kernel.py::test_l9_write_kernel_stores_the_references_codes_and_scales",
    "tests/test_l9_engine.py::test_l9_accuracy_check_passes_and_fails_on_a_planted_quantizer",
]
