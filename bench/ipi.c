// TLB-shootdown cost of the uffd and madvise operations usermm uses, with a second thread of the
// process busy on the other vCPU (argument 1) or not (0). gcc -O2 -pthread bench/ipi.c -o ipi && ./ipi 1

#define _GNU_SOURCE
#include <linux/userfaultfd.h>
#include <sys/syscall.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#define PG 4096UL
#include <fcntl.h>
#ifndef UFFD_FEATURE_MOVE
#define UFFD_FEATURE_MOVE (1 << 16)
#endif
#ifndef _UFFDIO_MOVE
#define _UFFDIO_MOVE (0x05)
struct uffdio_move { __u64 dst, src, len, mode; __s64 move; };
#define UFFDIO_MOVE _IOWR(UFFDIO, _UFFDIO_MOVE, struct uffdio_move)
#define UFFDIO_MOVE_MODE_DONTWAKE 1
#endif
#ifndef SYS_process_madvise
#define SYS_process_madvise 440
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
static volatile int stop;
static void *spin(void *a) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(1,&s); sched_setaffinity(0,sizeof s,&s);
  volatile char *m = malloc(1<<20); while(!stop) for (int i=0;i<(1<<20);i+=64) m[i]++; return 0; }
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(int argc,char**argv){ setvbuf(stdout,0,_IONBF,0);
  int busy = argc>1 ? atoi(argv[1]) : 1;
  long N = 16384;
  cpu_set_t s; CPU_ZERO(&s); CPU_SET(0,&s); sched_setaffinity(0,sizeof s,&s);
  pthread_t t; if (busy) pthread_create(&t,0,spin,0);
  int uffd = syscall(SYS_userfaultfd, O_CLOEXEC|O_NONBLOCK);
  struct uffdio_api api={.api=UFFD_API,.features=UFFD_FEATURE_MOVE}; if(ioctl(uffd,UFFDIO_API,&api)){perror("api");return 1;}
  char *view = mmap(0,N*PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  char *pool = mmap(0,N*PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  char *buf = mmap(0,PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE,-1,0);
  madvise(view,N*PG,MADV_NOHUGEPAGE); madvise(pool,N*PG,MADV_NOHUGEPAGE);
  for(long i=0;i<N;i++) view[i*PG]=1;
  struct uffdio_register r={.range={(unsigned long)view,N*PG},.mode=UFFDIO_REGISTER_MODE_MISSING};
  if(ioctl(uffd,UFFDIO_REGISTER,&r)){perror("reg");return 1;}
  r.range.start=(unsigned long)pool; if(ioctl(uffd,UFFDIO_REGISTER,&r)){perror("reg2");return 1;}
  long *perm = malloc(N*sizeof(long)); for(long i=0;i<N;i++)perm[i]=i; srand(1);
  for(long i=N-1;i>0;i--){long j=rand()%(i+1); long x=perm[i];perm[i]=perm[j];perm[j]=x;}
  // (1) single MOVE view->pool, random pages
  double t0=now();
  for(long k=0;k<N;k++){long i=perm[k]; struct uffdio_move m={.dst=(unsigned long)pool+i*PG,.src=(unsigned long)view+i*PG,.len=PG,.mode=UFFDIO_MOVE_MODE_DONTWAKE}; if(ioctl(uffd,UFFDIO_MOVE,&m)){perror("move");return 1;}}
  double t1=now(); printf("MOVE 1 page out: %.2f us/page\n",(t1-t0)/N/1e3);
  // (2) COPY pool->view single page (no flush)
  t0=now();
  for(long k=0;k<N;k++){long i=perm[k]; struct uffdio_copy c={.dst=(unsigned long)view+i*PG,.src=(unsigned long)pool+i*PG,.len=PG,.mode=UFFDIO_COPY_MODE_DONTWAKE}; if(ioctl(uffd,UFFDIO_COPY,&c)){perror("copy");return 1;}}
  t1=now(); printf("COPY 1 page in: %.2f us/page\n",(t1-t0)/N/1e3);
  // (3) process_madvise DONTNEED of pool slots, 32 scattered per call
  int pidfd = syscall(SYS_pidfd_open, getpid(), 0);
  struct iovec iov[64];
  t0=now();
  for(long k=0;k<N;k+=32){ for(int j=0;j<32;j++){iov[j].iov_base=pool+perm[k+j]*PG; iov[j].iov_len=PG;}
    long rc=syscall(SYS_process_madvise,pidfd,iov,32,MADV_DONTNEED,0); if(rc<0){perror("process_madvise");return 1;}}
  t1=now(); printf("process_madvise DONTNEED 32 scattered: %.2f us/page\n",(t1-t0)/N/1e3);
  // (4) MOVE view->pool again then MOVE back
  t0=now();
  for(long k=0;k<N;k++){long i=perm[k]; struct uffdio_move m={.dst=(unsigned long)pool+i*PG,.src=(unsigned long)view+i*PG,.len=PG,.mode=UFFDIO_MOVE_MODE_DONTWAKE}; if(ioctl(uffd,UFFDIO_MOVE,&m)){perror("move2");return 1;}}
  t1=now(); printf("MOVE 1 page out (2nd): %.2f us/page\n",(t1-t0)/N/1e3);
  t0=now();
  for(long k=0;k<N;k++){long i=perm[k]; struct uffdio_move m={.dst=(unsigned long)view+i*PG,.src=(unsigned long)pool+i*PG,.len=PG,.mode=UFFDIO_MOVE_MODE_DONTWAKE}; if(ioctl(uffd,UFFDIO_MOVE,&m)){perror("move3");return 1;}}
  t1=now(); printf("MOVE 1 page in: %.2f us/page\n",(t1-t0)/N/1e3);
  // (5) madvise DONTNEED single page of view
  t0=now();
  for(long k=0;k<N;k++){long i=perm[k]; madvise(view+i*PG,PG,MADV_DONTNEED);}
  t1=now(); printf("madvise DONTNEED 1 page: %.2f us/page\n",(t1-t0)/N/1e3);
  // (6) COPY from a bounce buffer
  t0=now();
  for(long k=0;k<N;k++){long i=perm[k]; struct uffdio_copy c={.dst=(unsigned long)view+i*PG,.src=(unsigned long)buf,.len=PG,.mode=UFFDIO_COPY_MODE_DONTWAKE}; if(ioctl(uffd,UFFDIO_COPY,&c)){perror("copy2");return 1;}}
  t1=now(); printf("COPY 1 page from bounce: %.2f us/page\n",(t1-t0)/N/1e3);
  // (7) process_madvise DONTNEED view 32 scattered
  t0=now();
  for(long k=0;k<N;k+=32){ for(int j=0;j<32;j++){iov[j].iov_base=view+perm[k+j]*PG; iov[j].iov_len=PG;}
    long rc=syscall(SYS_process_madvise,pidfd,iov,32,MADV_DONTNEED,0); if(rc<0){perror("process_madvise");return 1;}}
  t1=now(); printf("process_madvise DONTNEED view 32 scattered: %.2f us/page\n",(t1-t0)/N/1e3);
  stop=1; return 0;}
