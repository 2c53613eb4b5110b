"""scripts/decode_limits.py: its read kernel (the bytes a decode kernel streams, through the same
tensor-core path, without the attention math) is checked against torch before anything is timed."""
import scripts.decode_limits as dl


def test_decode_limits_read_kernel_sums_every_byte_it_must_read():
    assert dl.check("cpu")


def test_decode_limits_check_fails_on_a_read_that_misses_bytes(monkeypatch):
    """A read kernel that drops a tile's last key (the planted bug) makes the check, and the script, fail."""
    real = dl.read

    def short(k, v, table, kv_lens, num_splits, block_n, **kw):
        return real(k, v, table, (kv_lens - 1).clamp(min=0), num_splits, block_n, **kw)
    monkeypatch.setattr(dl, "read", short)
    assert not dl.check("cpu")
    assert dl.main(["--quick"]) == 1
