/*
 * mknod-supervisor COMMAND [ARG...]: runs COMMAND (exec'd in this process, so a shell's $! is
 * COMMAND's pid) with character devices made for it from outside its user namespaces.
 *
 * The aarch64 tests run as root of a user namespace (tests/arm64/run.sh: the binfmt_misc
 * instance that runs them under qemu is private to it), where mknod(2) of a character device is
 * refused whatever the capabilities: the kernel asks for CAP_MKNOD of the initial namespace.
 * Here COMMAND and everything it starts carry a seccomp filter that stops mknod(2) and
 * mknodat(2) (SECCOMP_RET_USER_NOTIF) and hands them to a child of this process, which stays
 * real root in the host's namespaces. For a character device other than 0:0, asked for by a
 * process that holds CAP_MKNOD in its own user namespace, it makes the node where the caller
 * would have: the path resolved from the caller's root directory and working directory (or its
 * dirfd), the caller's umask applied, owned by its fsuid and fsgid; the caller sees mknod's
 * return value or errno. Every other call (FIFOs, sockets, files, whiteouts, block devices, a
 * caller without the capability) goes on to the kernel as if nothing had stopped it. The
 * supervisor ends when the last process under the filter has ended.
 *
 * Built static by tests/arm64/run.sh in its build root (Linux 5.10 or later at run time).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__x86_64__)
#define ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define ARCH AUDIT_ARCH_AARCH64
#else
#error "mknod-supervisor: unknown architecture"
#endif

#define CAP_MKNOD_BIT 27
#define CONTINUE (-1)

static const char *me = "mknod-supervisor";

static void die(const char *what) {
  fprintf(stderr, "%s: %s: %s\n", me, what, strerror(errno));
  exit(125);
}

/* The filter: mknod and mknodat of this architecture to the supervisor, all else allowed. */
static int install_filter(void) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
#ifdef __NR_mknod
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mknod, 2, 0),
#else
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mknodat, 2, 0),
#endif
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mknodat, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
  };
  struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
  /* real root: CAP_SYS_ADMIN instead of no_new_privs, so that set-user-ID programs still work */
  int fd = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER,
                        &prog);
  if (fd < 0) die("seccomp(SECCOMP_SET_MODE_FILTER)");
  return fd;
}

static void send_fd(int sock, int fd) {
  char byte = 0;
  struct iovec iov = {.iov_base = &byte, .iov_len = 1};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
  if (sendmsg(sock, &msg, 0) != 1) die("sendmsg");
}

static int recv_fd(int sock) {
  char byte;
  struct iovec iov = {.iov_base = &byte, .iov_len = 1};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
  ssize_t n = recvmsg(sock, &msg, 0);
  if (n == 0) exit(0); /* the command could not install the filter: nothing to supervise */
  if (n < 0) die("recvmsg");
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_type != SCM_RIGHTS) {
    errno = EPROTO;
    die("recvmsg: no file descriptor");
  }
  int fd;
  memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

/* What the caller's /proc/PID/status says: effective capabilities, umask, fsuid, fsgid. */
struct caller {
  uint64_t cap_eff;
  mode_t umask;
  uid_t fsuid;
  gid_t fsgid;
};

static int read_status(pid_t pid, struct caller *c) {
  char path[64], line[256];
  int found = 0;
  snprintf(path, sizeof path, "/proc/%d/status", pid);
  FILE *f = fopen(path, "re");
  if (!f) return -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long long cap;
    unsigned int mask, r, e, s, fs;
    if (sscanf(line, "CapEff: %llx", &cap) == 1) c->cap_eff = cap, found |= 1;
    else if (sscanf(line, "Umask: %o", &mask) == 1) c->umask = mask, found |= 2;
    else if (sscanf(line, "Uid: %u %u %u %u", &r, &e, &s, &fs) == 4) c->fsuid = fs, found |= 4;
    else if (sscanf(line, "Gid: %u %u %u %u", &r, &e, &s, &fs) == 4) c->fsgid = fs, found |= 8;
  }
  fclose(f);
  return found == 15 ? 0 : -1;
}

/* The NUL-terminated string at addr in pid's memory; 0 or an errno. */
static int read_string(pid_t pid, uint64_t addr, char *buf, size_t size) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/mem", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ESRCH;
  size_t got = 0;
  while (got < size) {
    ssize_t n = pread(fd, buf + got, size - got, (off_t)(addr + got));
    if (n <= 0) break;
    if (memchr(buf + got, 0, (size_t)n)) {
      close(fd);
      return 0;
    }
    got += (size_t)n;
  }
  close(fd);
  return got >= size ? ENAMETOOLONG : EFAULT;
}

static int open_proc(pid_t pid, const char *what) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/%s", pid, what);
  return open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
}

/* mknodat in the caller's place, by a child that takes the caller's root and working
 * directory; 0 or an errno. */
static int make_node(int root, int dir, const char *name, mode_t mode, dev_t dev,
                     const struct caller *c) {
  pid_t child = fork();
  if (child < 0) return errno;
  if (child == 0) {
    if (fchdir(root) < 0 || chroot(".") < 0) _exit(errno);
    if (fchdir(dir) < 0) _exit(errno);
    umask(c->umask);
    if (mknodat(AT_FDCWD, name, mode, dev) < 0) _exit(errno);
    if (fchownat(AT_FDCWD, name, c->fsuid, c->fsgid, AT_SYMLINK_NOFOLLOW) < 0) {
      int e = errno;
      unlinkat(AT_FDCWD, name, 0);
      _exit(e);
    }
    _exit(0);
  }
  int status;
  while (waitpid(child, &status, 0) < 0)
    if (errno != EINTR) return errno;
  return WIFEXITED(status) ? WEXITSTATUS(status) : EIO;
}

/* The answer to one stopped call: 0, an errno, or CONTINUE (the kernel decides). */
static int answer(int listener, const struct seccomp_notif *req) {
  const __u64 *a = req->data.args;
  int nodirfd = 1, dirfd = AT_FDCWD;
  uint64_t addr;
  mode_t mode;
  unsigned int dev;
  if (req->data.nr == __NR_mknodat) {
    nodirfd = 0, dirfd = (int)a[0], addr = a[1], mode = (mode_t)a[2], dev = (unsigned int)a[3];
  } else {
    addr = a[0], mode = (mode_t)a[1], dev = (unsigned int)a[2];
  }
  if (!S_ISCHR(mode) || dev == 0) return CONTINUE;
  struct caller c = {0};
  if (read_status(req->pid, &c) < 0) return CONTINUE;
  if (!(c.cap_eff & (1ULL << CAP_MKNOD_BIT))) return CONTINUE;
  char name[4096];
  int e = read_string(req->pid, addr, name, sizeof name);
  if (e) return e;
  if (name[0] == 0) return ENOENT;
  int root = open_proc(req->pid, "root");
  char what[32];
  if (nodirfd || dirfd == AT_FDCWD) snprintf(what, sizeof what, "cwd");
  else snprintf(what, sizeof what, "fd/%d", dirfd);
  int dir = open_proc(req->pid, what);
  int result;
  if (root < 0) result = ESRCH;
  else if (dir < 0) result = name[0] == '/' ? 0 : (errno == ENOENT ? EBADF : errno);
  else result = 0;
  /* the caller is still the one that asked (its pid not reused): then the opened root and
   * directory are its own */
  if (ioctl(listener, SECCOMP_IOCTL_NOTIF_ID_VALID, &req->id) < 0) result = ESRCH;
  else if (result == 0) result = make_node(root, dir >= 0 ? dir : root, name, mode, dev, &c);
  if (root >= 0) close(root);
  if (dir >= 0) close(dir);
  return result;
}

static void supervise(int listener) {
  struct seccomp_notif_sizes sizes;
  if (syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sizes) < 0) die("SECCOMP_GET_NOTIF_SIZES");
  struct seccomp_notif *req = malloc(sizes.seccomp_notif);
  struct seccomp_notif_resp *resp = malloc(sizes.seccomp_notif_resp);
  if (!req || !resp) die("malloc");
  for (;;) {
    struct pollfd p = {.fd = listener, .events = POLLIN};
    if (poll(&p, 1, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (!(p.revents & POLLIN)) {
      if (p.revents & (POLLHUP | POLLERR)) return; /* no process left under the filter */
      continue;
    }
    memset(req, 0, sizes.seccomp_notif);
    if (ioctl(listener, SECCOMP_IOCTL_NOTIF_RECV, req) < 0) {
      if (errno == EINTR || errno == ENOENT) continue; /* the caller is gone */
      die("SECCOMP_IOCTL_NOTIF_RECV");
    }
    int r = answer(listener, req);
    memset(resp, 0, sizes.seccomp_notif_resp);
    resp->id = req->id;
    if (r == CONTINUE) resp->flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
    else resp->error = -r;
    if (ioctl(listener, SECCOMP_IOCTL_NOTIF_SEND, resp) < 0 && errno != ENOENT)
      die("SECCOMP_IOCTL_NOTIF_SEND");
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s COMMAND [ARG...]\n", me);
    return 2;
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) die("socketpair");
  pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    /* the supervisor: outside the filter; the command's output pipes are not held open */
    close(sv[0]);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) dup2(null, 0), dup2(null, 1);
    int listener = recv_fd(sv[1]);
    close(sv[1]);
    supervise(listener);
    return 0;
  }
  close(sv[1]);
  int listener = install_filter();
  send_fd(sv[0], listener);
  close(listener);
  close(sv[0]);
  execvp(argv[1], argv + 1);
  die(argv[1]);
}
