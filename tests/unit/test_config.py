"""hpccoll/config.py: every HPCCOLL_* variable is read there, per Communicator, with errors that
name the variable; the library reads no other HPCCOLL_* name anywhere."""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from hpccoll import config
from hpccoll.config import FOREVER_NS, SETTINGS, Config, timeout_ns

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_without_environment():
    c = Config.from_env({})
    assert (c.timeout, c.check, c.pdl, c.fuse, c.small_block, c.nccl_fallback, c.node_size,
            c.hier_rsag_bytes, c.host_shm) == (30.0, False, True, True, 128, False, None, 262144, True)


@pytest.mark.parametrize("var,raw,field,value", [
    ("HPCCOLL_TIMEOUT", "2.5", "timeout", 2.5),
    ("HPCCOLL_CHECK", "1", "check", True),
    ("HPCCOLL_PDL", "off", "pdl", False),
    ("HPCCOLL_FUSE", "0", "fuse", False),
    ("HPCCOLL_SMALL_BLOCK", "512", "small_block", 512),
    ("HPCCOLL_NCCL_FALLBACK", "yes", "nccl_fallback", True),
    ("HPCCOLL_NODE_SIZE", "2", "node_size", 2),
    ("HPCCOLL_HIER_RSAG_BYTES", "0", "hier_rsag_bytes", 0),
    ("HPCCOLL_HOST_SHM", "0", "host_shm", False),
    ("HPCCOLL_TUNING", "/tmp/t.json", "tuning", "/tmp/t.json"),
])
def test_each_variable_sets_its_field(var, raw, field, value):
    assert getattr(Config.from_env({var: raw}), field) == value


@pytest.mark.parametrize("var,raw", [
    ("HPCCOLL_TIMEOUT", "soon"), ("HPCCOLL_TIMEOUT", "0"), ("HPCCOLL_TIMEOUT", "-1"), ("HPCCOLL_TIMEOUT", "nan"),
    ("HPCCOLL_CHECK", "maybe"), ("HPCCOLL_FUSE", "sometimes"),
    ("HPCCOLL_SMALL_BLOCK", "100"), ("HPCCOLL_NODE_SIZE", "0"), ("HPCCOLL_NODE_SIZE", "two"),
    ("HPCCOLL_HIER_RSAG_BYTES", "-5"), ("HPCCOLL_HOST_SHM", "maybe"),
])
def test_bad_values_name_the_variable(var, raw):
    with pytest.raises(ValueError, match=re.escape(f"{var}={raw!r}")):
        Config.from_env({var: raw})


def test_explicit_arguments_win_and_are_checked():
    c = Config.from_env({"HPCCOLL_TIMEOUT": "5", "HPCCOLL_CHECK": "1"}, timeout=2, check=False)
    assert c.timeout == 2.0 and c.check is False
    with pytest.raises(ValueError, match="timeout="):
        Config.from_env({}, timeout=0)


@pytest.mark.parametrize("raw,seconds", [("1e10", 1e10), ("inf", math.inf), ("Infinity", math.inf),
                                         ("0.001", 0.001), ("30", 30.0)])
def test_a_timeout_of_any_positive_length_is_accepted(raw, seconds):
    assert Config.from_env({"HPCCOLL_TIMEOUT": raw}).timeout == seconds
    assert Config.from_env({}, timeout=float(raw)).timeout == seconds


@pytest.mark.parametrize("value", [math.nan, -1, -math.inf, 0, 0.0, np.float64(-2.5)])
def test_a_timeout_argument_that_is_no_positive_number_is_refused(value):
    with pytest.raises(ValueError, match=r"Communicator: timeout=.*use a positive number of seconds, or inf"):
        Config.from_env({}, timeout=value)


@pytest.mark.parametrize("value", ["5", "inf", b"5", True, np.bool_(False), [1.0], 1 + 2j])
def test_a_timeout_argument_that_is_no_number_is_refused(value):
    with pytest.raises(TypeError, match=r"Communicator: timeout=.* must be a number of seconds \(math.inf"):
        Config.from_env({}, timeout=value)


@pytest.mark.parametrize("value", [np.float32(0.5), np.int64(3), 7, 2.5])
def test_numpy_and_python_numbers_are_timeouts(value):
    assert Config.from_env({}, timeout=value).timeout == float(value)


def test_timeouts_in_nanoseconds_saturate_instead_of_overflowing():
    """The deadlines are int64 nanoseconds (u64 on the device): a longer timeout is the longest
    one, which never passes; none wraps to a small or negative value."""
    assert timeout_ns(0.3) == 300_000_000 and timeout_ns(1e-12) == 1
    assert timeout_ns(9.2e9) == int(9.2e18)
    for long_ in (9.3e9, 1e10, 1e300, math.inf):
        assert timeout_ns(long_) == FOREVER_NS == 2**63 - 1


def test_read_when_asked_not_at_import(monkeypatch):
    monkeypatch.setenv("HPCCOLL_TIMEOUT", "7")
    assert Config.from_env().timeout == 7.0
    monkeypatch.setenv("HPCCOLL_TIMEOUT", "8")
    assert Config.from_env().timeout == 8.0


def test_describe_lists_every_variable_and_flags_unknown_ones():
    text = config.describe(environ={"HPCCOLL_FUSE": "0", "HPCCOLL_TYPO": "1"})
    for s in SETTINGS:
        assert s.var in text
    assert "HPCCOLL_TYPO" in text and "not hpccoll settings" in text


def test_the_docs_table_is_the_settings_table():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert config.markdown_table() in doc, "docs/configuration.md: paste config.markdown_table() there"


def test_no_other_module_reads_hpccoll_variables():
    """One module reads the library's variables: a read anywhere else in hpccoll/ fails here."""
    offenders = []
    for path in (ROOT / "hpccoll").rglob("*.py"):
        if path.name == "config.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"environ(\.get)?[\[\(]\s*[\"']HPCCOLL_|getenv\(\s*[\"']HPCCOLL_", line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_every_variable_named_in_the_library_is_a_setting():
    known = {s.var for s in SETTINGS} | {"HPCCOLL_"}
    named = set()
    for path in (ROOT / "hpccoll").rglob("*.py"):
        named |= set(re.findall(r"HPCCOLL_[A-Z0-9_]*", path.read_text()))
    assert named <= known, f"named in hpccoll/ but not in config.SETTINGS: {sorted(named - known)}"
