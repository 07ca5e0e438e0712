"""Bad input to every Python entry point, table-driven: each is refused with a usermm error
(InvalidArgumentError is also a ValueError) whose message names the value, never a raw
OverflowError or TypeError from the argument conversion, a panic, or a crash of the interpreter.
Also what swap="file:PATH" does to the file system."""

import gc
import os

import pytest

import usermm

MiB = 1 << 20


@pytest.fixture(scope="module")
def mm():
    return usermm.Manager(budget="8M", swap="ram", swap_size="32M")


@pytest.fixture()
def data(tmp_path):
    f = tmp_path / "data"
    f.write_bytes(bytes(range(256)) * 32)  # 8192 bytes
    return f


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda mm, f: mm.map_file(str(f), 4096, offset=-4096), ["offset=-4096"]),
        (lambda mm, f: mm.map_file(str(f), -1), ["nbytes=-1"]),
        (lambda mm, f: mm.map_file(str(f), 4096, offset=2**64), ["offset=18446744073709551616"]),
        (lambda mm, f: mm.map_file(str(f), 4096, offset="x"), ["offset", "x"]),
        (lambda mm, f: mm.map_file(str(f), "lots"), ["nbytes", "lots"]),
        (lambda mm, f: mm.map_file(str(f), 3 * 4096), ["past the end", "8192 bytes", "SIGBUS"]),
        (lambda mm, f: mm.map_file(str(f), 4096, offset=8192), ["past the end"]),
        (lambda mm, f: mm.map_file("/proc/self/status", 4096), ["/proc/self/status", "procfs"]),
        (lambda mm, f: mm.map_file("/proc/self/status"), ["/proc/self/status", "procfs"]),
        (lambda mm, f: mm.map_file("/sys/kernel/mm/transparent_hugepage/enabled", 4096), ["sysfs"]),
        (lambda mm, f: mm.map_file("/dev/zero", 4096), ["/dev/zero", "not a regular file"]),
        (lambda mm, f: mm.map_file(str(f.parent), 4096), ["not a regular file"]),
        (lambda mm, f: mm.map_file(str(f.parent / "missing"), 4096), ["missing"]),
        (lambda mm, f: mm.map_anon(-4096), ["nbytes=-4096"]),
        (lambda mm, f: mm.map_anon(2**70), ["nbytes=1180591620717411303424"]),
        (lambda mm, f: mm.map_anon("1e9"), ["nbytes", "1e9"]),
        (lambda mm, f: mm.map_anon(0).flush(0, -1), ["length=-1"]),
        (lambda mm, f: mm.map_anon(4096).flush(-4096), ["offset=-4096"]),
        (lambda mm, f: mm.map_anon(4096).flush(2**64), ["offset=18446744073709551616"]),
        (lambda mm, f: mm.map_anon(4096).flush(8192), ["past the end"]),
        (lambda mm, f: mm.map_anon(4096).discard(-1), ["offset=-1"]),
        (lambda mm, f: mm.map_anon(4096).discard(0, -4096), ["length=-4096"]),
        (lambda mm, f: mm.array(-1), ["dimension 0 is -1"]),
        (lambda mm, f: mm.array(2**70), ["1180591620717411303424", "64 bits"]),
        (lambda mm, f: mm.array((2, -2**70)), ["64 bits"]),
        (lambda mm, f: mm.array((2**40, 2**40)), ["larger than the address space"]),
        (lambda mm, f: usermm.parse_size("-1"), ["-1"]),
        (lambda mm, f: usermm.parse_size("99999999999999999999"), ["too large"]),
        (lambda mm, f: usermm.parse_size(""), ['""']),
        (lambda mm, f: usermm.Manager(budget=0), ["budget of 0 bytes", "minimum"]),
        (lambda mm, f: usermm.Manager(budget="64T"), ["16 TiB"]),
        (lambda mm, f: usermm.Manager(budget=2**64), ["budget=18446744073709551616"]),
        (lambda mm, f: usermm.Manager(budget="8M", swap_size=100, swap="ram"), ["swap size 100 bytes"]),
        (lambda mm, f: usermm.Manager(budget="8M", swap="file:"), ['"file:"']),
        (lambda mm, f: usermm.Manager(budget="8M", settings="laptop_mode=on,nosuch=1"), ["nosuch"]),
        (lambda mm, f: usermm.Manager(budget="8M", settings={"laptop_mode": 2**70}), ["laptop_mode", "1180591620717411303424"]),
        (lambda mm, f: usermm.Manager(budget="8M", settings={"laptop_mode": -1}), ["laptop_mode", "-1"]),
    ],
)
def test_bad_input_is_named(mm, data, call, words):
    with pytest.raises(usermm.InvalidArgumentError) as ei:
        call(mm, data)
    msg = str(ei.value)
    assert isinstance(ei.value, ValueError)
    for w in words:
        assert w in msg, (w, msg)
    assert "Some(" not in msg and " { " not in msg, msg


def test_a_good_file_mapping_still_works(mm, data):
    r = mm.map_file(str(data), 4096, offset=4096)
    assert bytes(memoryview(r)[:3]) == bytes([0, 1, 2])
    r.flush(0, 4096)
    r.flush()


def test_swap_file_that_usermm_did_not_make_is_refused_and_untouched(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("precious text\n")
    with pytest.raises(usermm.Error) as ei:
        usermm.Manager(budget="8M", swap=f"file:{f}")
    msg = str(ei.value)
    assert str(f) in msg and "not a usermm swap file" in msg, msg
    assert f.read_text() == "precious text\n"


def _unlinked_fd_of(path):
    """The /proc/self/fd name of this process's open swap file for `path`, which has no name:
    its path unlinked at open, or never linked (O_TMPFILE in the path's directory)."""
    want = f"{path} (deleted)"
    prefix = f"{os.path.dirname(str(path))}/#"
    for fd in os.listdir("/proc/self/fd"):
        try:
            t = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if t == want or (t.startswith(prefix) and t.endswith(" (deleted)")):
            return f"/proc/self/fd/{fd}"
    return None


def test_a_swap_path_is_unlinked_as_soon_as_it_is_opened(tmp_path):
    path = tmp_path / "swap"
    m = usermm.Manager(budget="8M", swap=f"file:{path}", swap_size="32M")
    a = m.array(3 * MiB, "u8")  # 24 MiB through an 8 MiB budget
    a[:] = 5
    assert int(a[::4096].sum()) == 5 * len(a[::4096])
    assert str(path) in m.swap, m.swap
    # Nothing on disk by name, even while the manager lives (a SIGKILL leaves nothing): the
    # manager's descriptor holds the file, mode 0600.
    assert not path.exists(), "the swap path must be unlinked at open"
    fd = _unlinked_fd_of(path)
    assert fd is not None and (os.stat(fd).st_mode & 0o777) == 0o600
    # The path is free again: a second manager makes its own file there.
    m2 = usermm.Manager(budget="8M", swap=f"file:{path}", swap_size="32M")
    b = m2.array(3 * MiB, "u8")
    b[:] = 7
    assert int(b[::4096].sum()) == 7 * len(b[::4096])
    assert int(a[::4096].sum()) == 5 * len(a[::4096])
    del a, b, m, m2
    gc.collect()
    assert not path.exists(), "process memory left on disk"
    assert _unlinked_fd_of(path) is None, "the swap file outlived its managers"


def test_default_managers_of_two_processes_each_get_their_own_swap_file(tmp_path):
    # Two processes configured by the same environment (USERMM_SWAP=file:PATH, as every process
    # of a program inherits it): the first default manager unlinks the path as soon as it has
    # opened the file, so the second process's default() makes its own file there; neither
    # sees the other's slots, and nothing is left on disk.
    import subprocess
    import sys

    path = tmp_path / "shared-swap"
    env = dict(os.environ, USERMM_BUDGET="8M", USERMM_SWAP=f"file:{path}", USERMM_SWAP_SIZE="32M")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, usermm; m = usermm.default(); a = m.array(4 << 20, 'u8'); a[:] = 1; "
         "print('ready', m.swap, flush=True); sys.stdin.readline(); "
         "assert int(a[::4096].sum()) == len(a[::4096]); print('intact', flush=True)"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ready = holder.stdout.readline().split(maxsplit=1)
        assert ready[0] == "ready" and str(path) in ready[1], ready
        assert not path.exists(), "the holder's swap path is unlinked at open"
        second = subprocess.run(
            [sys.executable, "-c",
             "import usermm; m = usermm.default(); a = m.array(4 << 20, 'u8'); a[:] = 2; "
             "assert int(a[::4096].sum()) == 2 * len(a[::4096]); print(m.swap)"],
            env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 0, second.stderr
        assert str(path) in second.stdout, second.stdout
        assert "in use by another usermm manager" not in second.stderr, second.stderr
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "intact"
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert holder.returncode == 0
    assert not path.exists(), "a swap file outlived its process"


def test_swap_encrypt_and_swap_keep_reach_the_file_device(tmp_path):
    path = tmp_path / "kept"
    m = usermm.Manager(budget="8M", swap=f"file:{path}", swap_size="32M",
                       swap_encrypt=True, swap_keep=True)
    assert "encrypted" in m.swap, m.swap
    a = m.array(3 * MiB, "u8")  # 24 MiB through an 8 MiB budget: pages reach the file
    a[:] = 0x5A
    assert int(a[::4096].sum()) == 0x5A * len(a[::4096])
    del a, m
    gc.collect()
    assert path.exists(), "swap_keep=True removed the file"
    # What the file holds is ciphertext: no page of 0x5A bytes in it.
    data = path.read_bytes()
    assert bytes([0x5A]) * 4096 not in data
    path.unlink()


def test_a_panic_becomes_internal_error_not_a_crash():
    """A Rust panic inside an entry point reaches Python as usermm.InternalError (an ordinary
    Exception naming the call and the panic), never as PyO3's PanicException (a BaseException
    that `except Exception` misses) or a crash; the module keeps working afterwards."""
    from usermm import usermm as native  # the extension module itself (private names)

    with pytest.raises(usermm.InternalError) as e:
        native._test_panic("injected by the test")
    msg = str(e.value)
    assert "injected by the test" in msg and "_test_panic" in msg and "report" in msg, msg
    assert isinstance(e.value, usermm.Error) and isinstance(e.value, Exception)
    assert usermm.parse_size("4k") == 4096


def _entry_points(src):
    """(name, body) of every function PyO3 exposes in one source file: the methods of
    #[pymethods] blocks and the #[pyfunction]s (unsafe FFI slots excluded)."""
    import re

    def close(s, i):  # index of the brace matching s[i] == "{", skipping strings and comments
        depth = 0
        while True:
            c = s[i]
            if c == '"':
                i += 1
                while s[i] != '"':
                    i += 2 if s[i] == "\\" else 1
            elif s.startswith("//", i):
                i = s.index("\n", i)
                continue
            elif c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return i
            i += 1

    blocks = [(m.end() - 1, close(src, m.end() - 1))
              for m in re.finditer(r"#\[pymethods\]\s*impl \w+ \{", src)]
    out = []
    for m in re.finditer(r"\n\s*(?:pub )?fn (\w+)", src):
        inside = any(a < m.start() < b for a, b in blocks)
        attrs = src[:m.start()].rstrip().rsplit("\n\n", 1)[-1]
        if not inside and "#[pyfunction]" not in attrs:
            continue
        open_ = src.index("{", src.index(")", m.end()))
        out.append((m.group(1), src[open_ + 1:close(src, open_)].strip()))
    return out


def test_every_entry_point_runs_behind_the_panic_guard():
    """Every method and function the module exposes (python/src) runs its whole body inside
    errors::guard, so no panic can cross into Python. A new entry point without it fails here."""
    src_dir = os.path.join(os.path.dirname(__file__), os.pardir, "src")
    seen, unguarded = 0, []
    for name in sorted(os.listdir(src_dir)):
        if not name.endswith(".rs"):
            continue
        with open(os.path.join(src_dir, name)) as f:
            src = f.read()
        for fn, body in _entry_points(src):
            seen += 1
            if not (body.startswith("crate::errors::guard(") or body.startswith("guard(")):
                unguarded.append(f"{name}: {fn}: {body[:60]!r}")
    assert seen >= 30, f"found only {seen} entry points: the scan is broken"
    assert not unguarded, "entry points outside the panic guard:\n" + "\n".join(unguarded)
