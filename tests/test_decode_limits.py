"""benchmarks/decode_limits.py: its read kernel (the bytes a decode kernel streams, through the same
tensor-core path, without the attention math) is checked against torch before anything is timed."""
import benchmarks.decode_limits as dl
from plumbing.runtime import INTERPRET

DEVICE = "cpu" if INTERPRET else "cuda"


def test_decode_limits_read_kernel_sums_every_byte_it_must_read():
    assert dl.check(DEVICE)


def test_decode_limits_check_fails_on_a_read_that_misses_bytes(monkeypatch):
    """A read kernel that misses each sequence's last key (the planted bug) makes the check, and the
    script's CPU run, fail."""
    real = dl.read

    def short(k, v, table, kv_lens, num_splits, block_n, **kw):
        return real(k, v, table, (kv_lens - 1).clamp(min=0), num_splits, block_n, **kw)
    monkeypatch.setattr(dl, "read", short)
    assert not dl.check(DEVICE)
    assert dl.main(["--quick"]) == 1
