# Calls glibc's path-taking entry points through ctypes and prints one line per call.
import ctypes, errno, os

libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
O_RDONLY, O_DIRECTORY = 0, 0o200000
STAT_VER = 1 if os.uname().machine == "x86_64" else 0
GPU = b"0008:06:00.0"
VERSION = b"/proc/driver/nvidia/version"
LINK = b"/sys/bus/pci/devices/" + GPU
buf = ctypes.create_string_buffer(4096)

for name in ("realpath", "canonicalize_file_name", "__realpath_chk", "get_current_dir_name", "getcwd"):
    getattr(libc, name).restype = ctypes.c_char_p
for name in ("fopen", "fopen64", "freopen", "opendir"):
    getattr(libc, name).restype = ctypes.c_void_p
libc.fgets.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
libc.closedir.argtypes = [ctypes.c_void_p]
libc.freopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p]


def fd_ok(name, fd):
    data = os.read(fd, 4) if fd >= 0 else b""
    if fd >= 0:
        os.close(fd)
    print(name, "ok" if data == b"NVRM" else "bad %d" % fd)


for name in ("open", "open64"):
    fd_ok(name, getattr(libc, name)(VERSION, O_RDONLY, 0))
for name in ("__open_2", "__open64_2"):
    fd_ok(name, getattr(libc, name)(VERSION, O_RDONLY))
for name in ("openat", "openat64"):
    fd_ok(name, getattr(libc, name)(AT_FDCWD, VERSION, O_RDONLY, 0))
for name in ("__openat_2", "__openat64_2"):
    fd_ok(name, getattr(libc, name)(AT_FDCWD, VERSION, O_RDONLY))
# hwloc's pattern: open "/" once, then openat relative to it.
rootfd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
fd_ok("openat-rootfd", libc.openat(rootfd, b"proc/driver/nvidia/version", O_RDONLY, 0))

for name in ("fopen", "fopen64"):
    f = getattr(libc, name)(VERSION, b"r")
    ok = bool(f) and libc.fgets(buf, 5, f) and buf.value == b"NVRM"
    if f:
        libc.fclose(f)
    print(name, "ok" if ok else "bad")
f = libc.fopen(b"/etc/hostname", b"r")
f = libc.freopen(VERSION, b"r", f)
print("freopen", "ok" if f and libc.fgets(buf, 5, f) and buf.value == b"NVRM" else "bad")
libc.fclose(f)
d = libc.opendir(b"/proc/driver/nvidia/gpus")
print("opendir", "ok" if d else "bad")
libc.closedir(d)

namelist = ctypes.c_void_p()
for name in ("scandir", "scandir64"):
    print(name, getattr(libc, name)(b"/proc/driver/nvidia", ctypes.byref(namelist), None, None))

for name in ("stat", "lstat", "stat64", "lstat64"):
    print(name, "ok" if getattr(libc, name)(VERSION, buf) == 0 else "bad")
for name in ("fstatat", "fstatat64"):
    print(name, "ok" if getattr(libc, name)(rootfd, VERSION[1:], buf, 0) == 0 else "bad")
for name in ("__xstat", "__lxstat", "__xstat64", "__lxstat64"):
    print(name, "ok" if getattr(libc, name)(STAT_VER, VERSION, buf) == 0 else "bad")
for name in ("__fxstatat", "__fxstatat64"):
    print(name, "ok" if getattr(libc, name)(STAT_VER, AT_FDCWD, VERSION, buf, 0) == 0 else "bad")
print("statx", "ok" if libc.statx(AT_FDCWD, VERSION, 0, 0xFFF, buf) == 0 else "bad")

for name in ("access", "euidaccess", "eaccess"):
    print(name, "ok" if getattr(libc, name)(VERSION, os.R_OK) == 0 else "bad")
print("faccessat", "ok" if libc.faccessat(AT_FDCWD, VERSION, os.R_OK, 0) == 0 else "bad")

n = libc.readlink(LINK, buf, 4096)
print("readlink", buf.raw[:n].decode())
n = libc.readlinkat(rootfd, LINK[1:], buf, 4096)
print("readlinkat", buf.raw[:n].decode())
print("realpath", libc.realpath(LINK, None).decode())
print("canonicalize_file_name", libc.canonicalize_file_name(b"/proc/driver/nvidia/gpus/").decode())
print("__realpath_chk", libc.__realpath_chk(b"/proc/driver/nvidia/gpus/..", buf, 4096).decode())

WALK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
seen = []
cb = WALK(lambda path, sb, flag, ftw: seen.append(path) or 0)
libc.nftw(b"/proc/driver/nvidia", cb, 8, 0)
print("nftw", len(seen))
seen.clear()
FTW = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int)
cb2 = FTW(lambda path, sb, flag: seen.append(path) or 0)
libc.ftw(b"/proc/driver/nvidia", cb2, 8)
print("ftw", len(seen))


class Glob(ctypes.Structure):
    _fields_ = [("pathc", ctypes.c_size_t), ("pathv", ctypes.POINTER(ctypes.c_char_p)), ("offs", ctypes.c_size_t),
                ("pad", ctypes.c_byte * 128)]


g = Glob()
libc.glob(b"/proc/driver/nvidia/[pv]*", 0, None, ctypes.byref(g))
print("glob", " ".join(g.pathv[i].decode() for i in range(g.pathc)))

libc.chdir(b"/proc/driver/nvidia")
print("chdir+getcwd", libc.getcwd(buf, 4096).decode())
print("get_current_dir_name", libc.get_current_dir_name().decode())
os.chdir("/")

ctypes.set_errno(1234)
libc.stat(b"/usr", buf)  # fast pass-through
libc.stat(b"/proc/self", buf)  # slow path, passed through
libc.stat(VERSION, buf)  # redirected
libc.stat(b"proc/driver/nvidia/version", buf)  # relative, through the working directory
print("errno kept", ctypes.get_errno())
print("missing", errno.errorcode[ctypes.get_errno()] if libc.open(b"/proc/driver/nvidia/nothing", 0) < 0 else "opened")
fd = libc.open(b"/etc/hostname", O_RDONLY)
print("outside /etc/hostname", "ok" if fd >= 0 and os.read(fd, 4096) == open("/etc/hostname", "rb").read() else "bad")
