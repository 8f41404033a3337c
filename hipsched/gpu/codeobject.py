"""Reading kernel names out of a compiled code object: AMD HSACO and NVIDIA CUBIN are both ELF64 files
whose symbol table lists each kernel as a global function; PTX text names them in `.entry` lines.
Used by `python -m hipsched compile` to report what each source really provides (kernels generated
by macros included)."""
from __future__ import annotations

import re
import struct

_STT_FUNC, _STB_GLOBAL, _SHT_SYMTAB = 2, 1, 2
_ENTRY_RE = re.compile(rb"\.entry\s+([A-Za-z_]\w*)")


def kernel_symbols(code: bytes) -> list[str] | None:
    """Sorted global function names in an ELF64 code object or PTX text; None if not parseable."""
    if code[:4] != b"\x7fELF":
        found = _ENTRY_RE.findall(code)
        return sorted({n.decode() for n in found}) if found else None
    try:
        if code[4] != 2 or code[5] != 1:     # ELFCLASS64, little endian
            return None
        shoff, = struct.unpack_from("<Q", code, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", code, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", code, shoff + i * shentsize) for i in range(shnum)]
        names = set()
        for _name, stype, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
            if stype != _SHT_SYMTAB or not entsize:
                continue
            str_off = sections[link][4]
            for pos in range(offset, offset + size, entsize):
                st_name, st_info = struct.unpack_from("<IB", code, pos)
                if st_info & 0xF == _STT_FUNC and st_info >> 4 == _STB_GLOBAL and st_name:
                    end = code.index(b"\0", str_off + st_name)
                    names.add(code[str_off + st_name:end].decode(errors="replace"))
        return sorted(names)
    except (struct.error, IndexError, ValueError):
        return None
