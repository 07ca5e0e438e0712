/* pvw: how long process_vm_writev(2) takes to write N MiB into a fork child's fresh anonymous
 * mapping, the way usermm writes a parent's resident managed pages into its child at fork
 * (mm/fork.rs write_for_fork: one iovec per page, 256 pages a call). Issue 12.
 * usage: pvw MIB PAGES_PER_CALL [1: the child populates the mapping first]
 * Linux 6.18 on this VM (2026-11-29, with a soak running beside it): 24 MiB, 256 or 1024 pages
 * a call: 16.6-17.1 ms; populated first: 18.6-20.0 ms. The fault-in is not the cost; the copy
 * through the remote page walk is.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
int main(int argc,char**argv){
  size_t len=(size_t)atoi(argv[1])<<20; int per=atoi(argv[2]); int prepop=argc>3?atoi(argv[3]):0;
  char*a=mmap(0,len,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  char*b=mmap(0,len,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  memset(a,1,len); madvise(b,len,MADV_WIPEONFORK);
  int p[2],q[2]; pipe(p); pipe(q);
  pid_t c=fork();
  if(!c){ if(prepop) madvise(b,len,MADV_POPULATE_WRITE); char x; write(q[1],"r",1); read(p[0],&x,1); _exit(b[4096]==1?0:3);}
  char x; read(q[0],&x,1);
  double t0=now();
  size_t pg=4096, n=len/pg; struct iovec l[1024], r[1024];
  for(size_t i=0;i<n;i+=per){ size_t k=(n-i<(size_t)per)?n-i:per;
    if(per<=1024){ for(size_t j=0;j<k;j++){l[j].iov_base=a+(i+j)*pg;l[j].iov_len=pg;r[j].iov_base=b+(i+j)*pg;r[j].iov_len=pg;}
      if(process_vm_writev(c,l,k,r,k,0)!=(ssize_t)(k*pg)){perror("pvw");return 1;}}
  }
  double t1=now(); write(p[1],"g",1); int st; waitpid(c,&st,0);
  printf("%zu MiB, %d pages/call, prepop %d: %.1f ms (child exit %d)\n",len>>20,per,prepop,t1-t0,WEXITSTATUS(st));
}
