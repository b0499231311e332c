"""dapo.file_lock: the one flock helper behind the submission record, the sqlite store and the model cache."""
import os
import time

import pytest

from dapo.file_lock import held_flock, try_flock


def test_a_held_lock_refuses_a_second_descriptor_until_released(tmp_path):
    path = tmp_path / "sub" / "x.lock"
    with held_flock(path) as fd:
        assert path.parent.is_dir() and fd >= 0
        assert try_flock(path) is None            # a second open file description: refused
    fd2 = try_flock(path)                          # released on leaving the block
    assert fd2 is not None
    os.close(fd2)


def test_waiting_past_the_timeout_raises_the_callers_error(tmp_path):
    path = tmp_path / "x.lock"
    holder = try_flock(path)
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="busy x"):
            with held_flock(path, 0.3, busy=lambda: RuntimeError("busy x"), poll_s=0.05):
                pass
        assert 0.3 <= time.monotonic() - t0 < 3
        with pytest.raises(TimeoutError, match="x.lock"):
            with held_flock(path, 0.1, poll_s=0.05):
                pass
    finally:
        os.close(holder)
