"""Reads a gflags flagfile (configs/*.flags) into a dict, as lns_train would.

Lines are `--name=value`; `#` starts a comment; `--flagfile=` nests (relative to the
including file). Later values win, so command-line overrides go last.
"""
import os


def read_flagfile(path, into=None, depth=0):
    flags = {} if into is None else into
    if depth > 8:
        raise ValueError(f"{path}: --flagfile nested more than 8 deep")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError(f"--flagfile: cannot read '{path}': {e.strerror}") from None
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parse_flag(line, flags, where=f"{path}:{n}", base=os.path.dirname(path), depth=depth)
    return flags


def parse_flag(arg, flags, where="command line", base=".", depth=0):
    if not arg.startswith("--") or "=" not in arg:
        raise ValueError(f"{where}: expected --name=value, got '{arg}'")
    name, value = arg[2:].split("=", 1)
    if name == "flagfile":
        read_flagfile(value if os.path.isabs(value) else os.path.join(base, value), flags, depth + 1)
    else:
        flags[name] = value
    return flags


def get_int(flags, name, default=None, lo=1, hi=1 << 40):
    if name not in flags:
        if default is None:
            raise ValueError(f"--{name}: missing (expected an integer in [{lo}, {hi}])")
        return default
    try:
        v = int(flags[name])
    except ValueError:
        raise ValueError(f"--{name}: expected an integer, got '{flags[name]}'") from None
    if not lo <= v <= hi:
        raise ValueError(f"--{name}: expected an integer in [{lo}, {hi}], got {v}")
    return v


def get_bool(flags, name, default=False):
    v = flags.get(name)
    if v is None:
        return default
    if v.lower() in ("true", "1", "yes"):
        return True
    if v.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"--{name}: expected true or false, got '{v}'")
