/* movefork: does UFFDIO_MOVE take a page that fork(2) shares copy-on-write? (issue 12: sharing a
 * managed region's resident pages with a fork child through the kernel's own copy-on-write.)
 * Four pages written, then registered (MISSING) with a pool range; each line moves one page out.
 * usage: movefork (root, or vm.unprivileged_userfaultfd=1 via /dev/userfaultfd access).
 * Linux 6.18 on this VM (2026-11-28):
 *   before fork: move page0 -> 4096
 *   shared with a live child: move page1 -> -16                  (EBUSY)
 *   child exited (0): move page1 (parent only read it) -> -16    (EBUSY: still not exclusive)
 *   parent wrote page2 after the child left: move page2 -> 4096  (the write made it exclusive)
 * So a page shared by fork stays unmovable until its owner writes it, even after the child is
 * gone: reclaim of such pages needs another way out of the view (copy to the slot, then zap). */
#define _GNU_SOURCE
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>
#define P 4096
struct uffdio_move_x { unsigned long long dst, src, len, mode; long long move; };
#define UFFDIO_MOVE_X _IOWR(0xAA, 0x05, struct uffdio_move_x)
#define FEAT_MOVE (1ULL<<16)
static int uffd;
static long mv(char *dst, char *src) {
  struct uffdio_move_x m = {.dst=(unsigned long)dst, .src=(unsigned long)src, .len=P, .mode=1};
  if (ioctl(uffd, UFFDIO_MOVE_X, &m)) return -errno;
  return m.move;
}
int main(void) {
  setvbuf(stdout, 0, _IONBF, 0);
  int dev = open("/dev/userfaultfd", O_RDWR|O_CLOEXEC);
  uffd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC|O_NONBLOCK);
  struct uffdio_api api = {.api=UFFD_API, .features=FEAT_MOVE};
  if (ioctl(uffd, UFFDIO_API, &api)) { perror("api"); return 1; }
  char *view = mmap(0, 4*P, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
  char *pool = mmap(0, 4*P, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, -1, 0);
  for (int i = 0; i < 4; i++) memset(view + i*P, 'a'+i, P);
  struct uffdio_register r = {.range={(unsigned long)view, 4*P}, .mode=UFFDIO_REGISTER_MODE_MISSING};
  if (ioctl(uffd, UFFDIO_REGISTER, &r)) { perror("reg"); return 1; }
  struct uffdio_register r2 = {.range={(unsigned long)pool, 4*P}, .mode=UFFDIO_REGISTER_MODE_MISSING};
  if (ioctl(uffd, UFFDIO_REGISTER, &r2)) { perror("reg2"); return 1; }
  printf("before fork: move page0 -> %ld\n", mv(pool, view));
  int pfd[2]; pipe(pfd);
  pid_t c = fork();
  if (c == 0) { char b; read(pfd[0], &b, 1); _exit(view[P] == 'b' ? 0 : 3); }
  printf("shared with a live child: move page1 -> %ld\n", mv(pool+P, view+P));
  write(pfd[1], "x", 1); int st; waitpid(c, &st, 0);
  printf("child exited (%d): move page1 (parent only read it) -> %ld\n", WEXITSTATUS(st), mv(pool+P, view+P));
  view[2*P] = 'z';
  printf("parent wrote page2 after the child left: move page2 -> %ld\n", mv(pool+2*P, view+2*P));
  return 0;
}
