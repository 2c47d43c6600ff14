"""The seccomp filter of every bubblewrap sandbox (envs.sandbox.local): the kernel keyring is refused.

Kernel keyrings sit outside every namespace bubblewrap creates: a key one sandbox adds to the
session or user keyring it inherited could be read by the next sandbox of the same trainer, even
under another uid (a possessor-permission key). As Docker's default seccomp profile does, the
keyring system calls (add_key, request_key, keyctl) fail with EPERM; every other call is allowed.

`keyring_filter()` is the compiled classic-BPF program bwrap's `--seccomp FD` reads (an array of
`struct sock_filter`, native byte order). It checks the calling ABI first (seccomp_data.arch), so
a 32-bit or x32 process on the same machine cannot use another ABI's numbers to reach the
keyring: x86_64 (x32 too: its numbers are x86_64's with bit 30 set), i386, aarch64 and 32-bit arm.
"""

from __future__ import annotations

import errno
import functools
import platform
import struct

from envs.errors import SandboxError

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h)
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data
_X32_BIT = 0x40000000
# audit arch -> (add_key, request_key, keyctl) numbers of that ABI
KEYRING_CALLS = {
    0xC000003E: (248, 249, 250),  # AUDIT_ARCH_X86_64 (x32: the same numbers | _X32_BIT)
    0x40000003: (286, 287, 288),  # AUDIT_ARCH_I386
    0xC00000B7: (217, 218, 219),  # AUDIT_ARCH_AARCH64
    0x40000028: (309, 310, 311),  # AUDIT_ARCH_ARM
}
_X86_64 = 0xC000003E
HOST_MACHINES = ("x86_64", "aarch64")  # the hosts whose native ABI the table covers


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _block(arch: int, calls: tuple[int, ...]) -> list[bytes]:
    """For one ABI: not it, skip the block; else EPERM for `calls`, allow the rest."""
    body = [_insn(_LD_W_ABS, _NR)]
    if arch == _X86_64:
        body.append(_insn(_AND_K, ~_X32_BIT & 0xFFFFFFFF))
    body += [_insn(_JEQ_K, nr, len(calls) - i, 0) for i, nr in enumerate(calls)]
    body += [_insn(_RET_K, RET_ALLOW), _insn(_RET_K, RET_ERRNO | errno.EPERM)]
    return [_insn(_JEQ_K, arch, 0, len(body)), *body]


@functools.cache
def keyring_filter() -> bytes:
    """The program (see the module docstring); SandboxError on a host whose ABI it does not cover."""
    if platform.machine() not in HOST_MACHINES:
        machine = platform.machine()
        raise SandboxError(f"no keyring seccomp filter for {machine}: bwrap sandboxes need {HOST_MACHINES}")
    program = [_insn(_LD_W_ABS, _ARCH)]
    for arch, calls in KEYRING_CALLS.items():
        program += _block(arch, calls)
    program.append(_insn(_RET_K, RET_ALLOW))  # an ABI the table does not know (none on these hosts)
    return b"".join(program)
