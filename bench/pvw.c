/* pvw: how long process_vm_writev(2) takes to write N MiB into a fork child's fresh anonymous
 * mapping, the way usermm writes a parent's resident managed pages into its child at fork
 * (mm/fork.rs write_for_fork: one iovec per page, 256 pages a call; the preload's
 * write_to_child: a second writer thread from 8 MiB). Issue 12.
 * usage: pvw MIB PAGES_PER_CALL [PREPOP (1: the child populates the mapping first) [THREADS]]
 * Linux 6.18 on this VM (2026-11-29, with a soak running beside it): 24 MiB, 256 or 1024 pages
 * a call: 16.6-17.1 ms; populated first: 18.6-20.0 ms. The fault-in is not the cost; the copy
 * through the remote page walk is. Later, quiet: 60 MiB, 256 pages a call, 1 thread 22.4-22.8
 * ms, 2 threads 12.7-18.0 ms.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
static char *a, *b; static size_t n; static pid_t c; static int per, nthreads;
static void *writer(void *arg){
  long id=(long)arg; size_t pg=4096, share=n/nthreads, lo=id*share, hi=id==nthreads-1?n:lo+share;
  struct iovec l[1024], r[1024];
  for(size_t i=lo;i<hi;i+=per){ size_t k=(hi-i<(size_t)per)?hi-i:per;
    for(size_t j=0;j<k;j++){l[j].iov_base=a+(i+j)*pg;l[j].iov_len=pg;r[j].iov_base=b+(i+j)*pg;r[j].iov_len=pg;}
    if(process_vm_writev(c,l,k,r,k,0)!=(ssize_t)(k*pg)){perror("pvw");exit(1);}
  }
  return 0;
}
int main(int argc,char**argv){
  if(argc<3){fprintf(stderr,"usage: pvw MIB PAGES_PER_CALL [PREPOP [THREADS]]\n");return 2;}
  size_t len=(size_t)atoi(argv[1])<<20; per=atoi(argv[2]); int prepop=argc>3?atoi(argv[3]):0;
  nthreads=argc>4?atoi(argv[4]):1;
  if(per<1||per>1024||nthreads<1||nthreads>8){fprintf(stderr,"PAGES_PER_CALL 1-1024, THREADS 1-8\n");return 2;}
  n=len/4096;
  a=mmap(0,len,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  b=mmap(0,len,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  memset(a,1,len); madvise(b,len,MADV_WIPEONFORK);
  int p[2],q[2]; pipe(p); pipe(q);
  c=fork();
  if(!c){ if(prepop) madvise(b,len,MADV_POPULATE_WRITE); char x; write(q[1],"r",1); read(p[0],&x,1); _exit(b[4096]==1?0:3);}
  char x; read(q[0],&x,1);
  double t0=now(); pthread_t th[8];
  for(long i=1;i<nthreads;i++) pthread_create(&th[i],0,writer,(void*)i);
  writer(0);
  for(long i=1;i<nthreads;i++) pthread_join(th[i],0);
  double t1=now(); write(p[1],"g",1); int st; waitpid(c,&st,0);
  printf("%zu MiB, %d pages/call, prepop %d, %d thread(s): %.1f ms (child exit %d)\n",len>>20,per,prepop,nthreads,t1-t0,WEXITSTATUS(st));
}
