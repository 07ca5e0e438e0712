"""Type stubs for the usermm extension module (maturin installs this as usermm/__init__.pyi)."""

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, SupportsIndex, Tuple, Union

import numpy.typing as npt

__version__: str
__all__: List[str]

Size = Union[str, int]
"""A size: "4096", "64k", "256M", "1.5G", "2T" (binary units) or an int of bytes."""

class Error(Exception):
    """Base class of every error usermm raises; the message says what was wrong and what to do."""

class InvalidArgumentError(Error, ValueError):
    """A malformed or out-of-range argument (size, swap device, switch, shape, dtype)."""

class CommitLimitError(Error, MemoryError):
    """Mapping would exceed the commit limit (budget + swap) under strict accounting."""

class UserfaultfdError(Error, OSError):
    """userfaultfd could not be opened or lacks a feature usermm needs (Linux 6.8+)."""

class IoError(Error, OSError):
    """An operating-system call failed; errno is set."""

class InternalError(Error):
    """A bug in usermm: a Rust panic caught at the Python boundary (the message names it)."""

class Manager:
    """A usermm memory manager: a memory budget, a swap device, fault handler threads, kswapd.

    Arrays and regions keep their manager alive; it stops when the last of them is gone.
    """

    def __init__(
        self,
        budget: Optional[Size] = "256M",
        swap: str = "file",
        swap_size: Optional[Size] = None,
        overcommit: bool = False,
        settings: Union[None, str, Mapping[str, Union[str, bool, int]]] = None,
        swap_encrypt: bool = False,
        swap_keep: bool = False,
        group: Optional[Union[str, "os.PathLike[str]"]] = None,
    ) -> None:
        """budget: resident memory limit; swap: "file", "file:PATH", "ram", "none",
        "zswap+file", "zswap+ram" or "zswap:OPTIONS+DEVICE";
        swap_size: swap capacity (default 4x budget); overcommit: allow mapping beyond
        budget + swap (pages that then find swap full raise SIGBUS when touched); settings:
        seed switches and laptop_mode as "name=value,..." or a dict; swap_encrypt: the file and
        Redis tiers store pages encrypted (a key held only in memory); swap_keep: keep a
        "file:PATH" swap file when the manager goes; group: a budget group file
        (create_group) whose one budget this manager shares with every manager that joins
        it, in this process or others."""
    def array(
        self,
        shape: Union[SupportsIndex, Sequence[SupportsIndex]],
        dtype: npt.DTypeLike = None,
    ) -> npt.NDArray[Any]:
        """A writable, C-contiguous, zero-filled numpy array whose memory is a usermm region.

        Any dtype without Python objects; default float64. arr.base is the usermm.Region."""
    def map_anon(self, nbytes: int) -> Region:
        """nbytes of zero-filled managed memory as a writable buffer."""
    def map_file(self, path: str, nbytes: Optional[int] = None, offset: int = 0, shared: bool = True) -> Region:
        """A file through usermm's page cache (shared: stores reach the file; private: copy-on-write)."""
    def sync(self) -> None:
        """Write back every dirty file page and fdatasync (sync(2))."""
    def vmstat(self) -> Dict[str, int]:
        """The counters, named as in /proc/vmstat."""
    @property
    def budget(self) -> int:
        """The memory budget in bytes."""
    @property
    def resident_bytes(self) -> int:
        """Bytes of memory in use now (at most the budget)."""
    @property
    def peak_resident_bytes(self) -> int:
        """The highest resident_bytes seen."""
    @property
    def swap_bytes(self) -> int:
        """Swap capacity in bytes (0 without swap)."""
    @property
    def swap(self) -> str:
        """A description of the swap device."""
    def swap_tiers(self) -> List[Tuple[str, Dict[str, int]]]:
        """The swap tiers, top first: (description, counters), e.g. the zswap pool then its device."""
    @property
    def committed_bytes(self) -> int:
        """Bytes committed by live regions."""
    @property
    def commit_limit_bytes(self) -> int:
        """budget + swap, in bytes."""
    @property
    def overcommit(self) -> bool:
        """Whether mapping beyond the commit limit is allowed."""
    @property
    def settings(self) -> Dict[str, str]:
        """Seed switches (descriptive values) and laptop_mode ("on"/"off")."""
    @property
    def uffd_mode(self) -> str:
        """"dev_userfaultfd" or "syscall_full" (system calls on swapped-out memory work), or
        "user_mode_only" (they fail with EFAULT on non-resident pages)."""

class Region:
    """Zero-filled managed memory exported through the buffer protocol (writable bytes).

    Anything viewing it (numpy arrays, memoryviews) keeps it alive; when the last reference
    goes, its memory and swap are freed."""

    def __init__(self, manager: Manager, nbytes: int) -> None: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...
    @property
    def nbytes(self) -> int:
        """The number of bytes exported."""
    @property
    def address(self) -> int:
        """Address of the first byte."""
    @property
    def manager(self) -> Manager:
        """The manager serving this region."""
    def flush(self, offset: int = 0, length: Optional[int] = None) -> None:
        """Write back a shared file region's dirty pages and fdatasync (msync(MS_SYNC))."""
    def discard(self, offset: int = 0, length: Optional[int] = None) -> None:
        """Free [offset, offset+length) (4 KiB aligned; None = to the end): reads return zeros."""
    def advise(self, advice: str, offset: int = 0, length: Optional[int] = None) -> None:
        """madvise(2): "random", "sequential" or "normal" (how faults of the whole region read
        ahead), or "willneed" (read [offset, offset+length) of a file region in the background)."""
    @property
    def access_pattern(self) -> str:
        """The pattern set by advise: "normal", "random" or "sequential"."""

def default() -> Manager:
    """The process-wide default Manager, created on first use from USERMM_BUDGET, USERMM_SWAP,
    USERMM_SWAP_SIZE, USERMM_OVERCOMMIT and USERMM_SET. A swap file that another manager holds
    is never shared: this one swaps to a temporary file and a UserWarning names the file."""

def switches() -> List[Dict[str, str]]:
    """The seed switches: name, seed, old, new, what."""

def create_group(path: Union[str, "os.PathLike[str]"], limit: Size) -> None:
    """Create a budget group file at path (mode 0600, must not exist) holding limit bytes
    for every Manager(group=path), in this process or others."""

def parse_size(s: str) -> int:
    """Parse "256M"-style sizes into bytes."""
