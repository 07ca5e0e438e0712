// Cross-process data paths for a usermm daemon (issue 12): a client process opens and registers a
// userfaultfd and sends it over a socketpair with SCM_RIGHTS; the daemon (the parent) resolves
// faults, moves, reads, drops and write-protects the client's pages, and watches fork.
// cc -O2 -o /tmp/xproc bench/xproc.c -lpthread && /tmp/xproc [all|in|rtt|out|drop|race|priv|fork2|fork] [busy] [fork: pages registered] [fork: pages resident]
// busy = the client runs a second thread spinning: on vCPU 1 (where the client runs) while the daemon (vCPU 0) works on
// the client, on vCPU 0 while the client (vCPU 1) works on itself (the "in-process" lines, as ipi.c's "1").
// busy = 3: the same spinner at SCHED_FIFO 10, so that it really occupies its vCPU on a loaded machine.

#define _GNU_SOURCE
#include <linux/userfaultfd.h>
#include <sys/syscall.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <errno.h>
#include <fcntl.h>
#define PG 4096UL
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
#ifndef MADV_COLD
#define MADV_COLD 20
#endif
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static double cpu(){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec*1e9+t.tv_nsec;}
static void pin(int cpu){cpu_set_t s;CPU_ZERO(&s);CPU_SET(cpu,&s);sched_setaffinity(0,sizeof s,&s);}
static void die(const char*m){perror(m);exit(1);}
static int cmpd(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}

static void send_fds(int s,int*fds,int n,void*data,size_t len){
  char cb[CMSG_SPACE(4*sizeof(int))]; memset(cb,0,sizeof cb);
  struct iovec io={data,len}; struct msghdr m={.msg_iov=&io,.msg_iovlen=1};
  if(n){m.msg_control=cb;m.msg_controllen=CMSG_SPACE(n*sizeof(int));
    struct cmsghdr*c=CMSG_FIRSTHDR(&m);c->cmsg_level=SOL_SOCKET;c->cmsg_type=SCM_RIGHTS;
    c->cmsg_len=CMSG_LEN(n*sizeof(int));memcpy(CMSG_DATA(c),fds,n*sizeof(int));}
  if(sendmsg(s,&m,0)<0)die("sendmsg");}
static int recv_fds(int s,int*fds,void*data,size_t len){
  char cb[CMSG_SPACE(4*sizeof(int))]; struct iovec io={data,len};
  struct msghdr m={.msg_iov=&io,.msg_iovlen=1,.msg_control=cb,.msg_controllen=sizeof cb};
  if(recvmsg(s,&m,MSG_WAITALL)<=0)die("recvmsg");
  int n=0;
  for(struct cmsghdr*c=CMSG_FIRSTHDR(&m);c;c=CMSG_NXTHDR(&m,c))
    if(c->cmsg_type==SCM_RIGHTS){n=(c->cmsg_len-CMSG_LEN(0))/sizeof(int);memcpy(fds,CMSG_DATA(c),n*sizeof(int));}
  return n;}

// ---- client ----
enum { OP_EXIT, OP_ZAP, OP_TOUCH, OP_WTOUCH, OP_PIN, OP_BUSY, OP_FORK, OP_READ, OP_WRITE,
       OP_DONTNEED, OP_MUNMAP, OP_MREMAP, OP_FORKTIME, OP_PLAINFORK, OP_CLOSEUFFD, OP_SELFMOVE, OP_SELFCOPY, OP_FORK2, OP_AWRITE };
struct cmd { long op, a, b; };
struct rep { long r[4]; double d[4]; };
struct hello { unsigned long view, pool; long n; int pid; };
static volatile int stop_spin; static pthread_t spin_t; static int spinning;
static int spin_cpu=1, spin_rt;
static void *spin(void *a) { pin(spin_cpu); if(spin_rt){ struct sched_param sp={.sched_priority=10}; pthread_setschedparam(pthread_self(),SCHED_FIFO,&sp); } volatile char *m = malloc(1<<20); while(!stop_spin) for (int i=0;i<(1<<20);i+=64) m[i]++; return 0; }
static char *cview, *cpool; static long cn;
static void *awriter(void *a){ *(volatile char*)(cview+(long)a*PG)='w'; return 0; }
static void client_loop(int s, int uffd, int is_child){
  struct cmd c; struct rep r;
  for(;;){
    if(read(s,&c,sizeof c)!=sizeof c) _exit(0);
    memset(&r,0,sizeof r);
    switch(c.op){
    case OP_EXIT: _exit(0);
    case OP_ZAP: { double t=now(); r.r[0]=madvise(cview+c.a*PG,c.b*PG,MADV_DONTNEED)?errno:0;
      if(!is_child) madvise(cpool+c.a*PG,c.b*PG,MADV_DONTNEED); r.d[0]=now()-t; break; }
    case OP_TOUCH: case OP_WTOUCH: { // touch c.b pages from c.a in a random order, one fault each
      long n=c.b; double *lat=malloc(n*sizeof(double)); long *perm=malloc(n*sizeof(long));
      for(long i=0;i<n;i++)perm[i]=i; srand(7); for(long i=n-1;i>0;i--){long j=rand()%(i+1);long x=perm[i];perm[i]=perm[j];perm[j]=x;}
      long sum=0;
      for(long i=0;i<n;i++){ volatile char*p=cview+(c.a+perm[i])*PG; double t=now();
        if(c.op==OP_TOUCH) sum+=*p; else *p=1; lat[i]=now()-t; }
      qsort(lat,n,sizeof(double),cmpd); r.d[0]=lat[n/2]; r.d[1]=lat[n*99/100]; r.r[0]=sum; free(lat); free(perm); break; }
    case OP_PIN: if(c.a>=0) pin(c.a); else { cpu_set_t st; CPU_ZERO(&st); CPU_SET(0,&st); CPU_SET(1,&st); sched_setaffinity(0,sizeof st,&st);} break;
    case OP_BUSY: if(c.a && !spinning){spin_cpu=(c.a&1)?1:0;spin_rt=c.a>2;stop_spin=0;pthread_create(&spin_t,0,spin,0);spinning=1;}
                  else if(!c.a && spinning){stop_spin=1;pthread_join(spin_t,0);spinning=0;} break;
    case OP_READ: { double t=now(); r.r[0]=*(volatile unsigned char*)(cview+c.a*PG); r.d[0]=now()-t; break; }
    case OP_WRITE: { double t=now(); *(volatile char*)(cview+c.a*PG)=(char)c.b; r.d[0]=now()-t; break; }
    case OP_DONTNEED: { double t=now(); r.r[0]=madvise(cview+c.a*PG,c.b*PG,MADV_DONTNEED)?errno:0; r.d[0]=now()-t; break; }
    case OP_MUNMAP: { double t=now(); r.r[0]=munmap(cview+c.a*PG,c.b*PG)?errno:0; r.d[0]=now()-t; break; }
    case OP_MREMAP: { // move c.b pages at c.a to a fresh address
      void *dst=mmap(0,c.b*PG,PROT_NONE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); double t=now();
      void *p=mremap(cview+c.a*PG,c.b*PG,c.b*PG,MREMAP_MAYMOVE|MREMAP_FIXED,dst);
      r.d[0]=now()-t; r.r[0]=p==MAP_FAILED?errno:0; r.r[1]=(long)p; break; }
    case OP_FORK: case OP_FORKTIME: {
      int sp[2]; socketpair(AF_UNIX,SOCK_STREAM,0,sp);
      double t=now(); pid_t pid=fork(); if(pid==0){ close(sp[0]); if(c.op==OP_FORKTIME) _exit(0); client_loop(sp[1],uffd,1); }
      r.d[0]=now()-t; r.r[0]=pid; close(sp[1]);
      if(c.op==OP_FORK){ send_fds(s,&sp[0],1,&r,sizeof r); close(sp[0]); continue; }
      close(sp[0]); waitpid(pid,0,0); break; }
    case OP_FORK2: { // fork without UFFD_FEATURE_EVENT_FORK: the child re-registers with a new uffd and sends it (atfork-style)
      int sp[2]; socketpair(AF_UNIX,SOCK_STREAM,0,sp);
      double t=now(); pid_t pid=fork();
      if(pid==0){ close(sp[0]); long pre=*(volatile unsigned char*)(cview+51*PG); // read before re-registering
        int u=syscall(SYS_userfaultfd,O_CLOEXEC|O_NONBLOCK); struct uffdio_api api={.api=UFFD_API,.features=UFFD_FEATURE_PAGEFAULT_FLAG_WP|UFFD_FEATURE_MOVE};
        if(ioctl(u,UFFDIO_API,&api)) die("child api");
        struct uffdio_register rg={.range={(unsigned long)cview,cn*PG},.mode=UFFDIO_REGISTER_MODE_MISSING|UFFDIO_REGISTER_MODE_WP};
        long rr=ioctl(u,UFFDIO_REGISTER,&rg)?errno:0; struct rep h={{pre,rr}}; send_fds(sp[1],&u,1,&h,sizeof h); client_loop(sp[1],u,1); }
      r.d[0]=now()-t; r.r[0]=pid; close(sp[1]); send_fds(s,&sp[0],1,&r,sizeof r); close(sp[0]); continue; }
    case OP_AWRITE: { pthread_t w; pthread_create(&w,0,awriter,(void*)c.a); pthread_detach(w); break; } // a second thread writes page c.a
    case OP_PLAINFORK: { // fork of a plain (unregistered) anon mapping of c.a pages, populated
      char *m=mmap(0,c.a*PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE,-1,0); madvise(m,c.a*PG,MADV_NOHUGEPAGE);
      for(long i=0;i<c.a;i++) m[i*PG]=1;
      double t=now(); pid_t pid=fork(); if(pid==0) _exit(0); r.d[0]=now()-t; waitpid(pid,0,0); munmap(m,c.a*PG); break; }
    case OP_CLOSEUFFD: r.r[0]=close(uffd); break;
    case OP_SELFMOVE: { // the client moves c.b pages itself (view->pool if c.a>=0 else pool->view), random order
      long n=c.b, *perm=malloc(n*sizeof(long)); for(long i=0;i<n;i++)perm[i]=i; srand(5);
      for(long i=n-1;i>0;i--){long j=rand()%(i+1);long x=perm[i];perm[i]=perm[j];perm[j]=x;}
      double t=now(), tc=cpu(); for(long k=0;k<n;k++){ long i=perm[k]; struct uffdio_move m={.mode=UFFDIO_MOVE_MODE_DONTWAKE,.len=PG};
        m.src=(unsigned long)(c.a>=0?cview:cpool)+i*PG; m.dst=(unsigned long)(c.a>=0?cpool:cview)+i*PG;
        if(ioctl(uffd,UFFDIO_MOVE,&m)){ r.r[0]=errno; break; } }
      r.d[0]=(now()-t)/n; r.d[1]=(cpu()-tc)/n; free(perm); break; }
    case OP_SELFCOPY: { // the client itself: UFFDIO_COPY 1 page from a bounce buffer into c.b empty view pages, random; then process_madvise(PIDFD_SELF-like pidfd) 32 scattered
      long n=c.b, *perm=malloc(n*sizeof(long)); for(long i=0;i<n;i++)perm[i]=i; srand(6);
      for(long i=n-1;i>0;i--){long j=rand()%(i+1);long x=perm[i];perm[i]=perm[j];perm[j]=x;}
      static char bb[4096] __attribute__((aligned(4096))); memset(bb,'S',PG);
      double t=now(), tc=cpu(); for(long k=0;k<n;k++){ struct uffdio_copy cp={.dst=(unsigned long)cview+perm[k]*PG,.src=(unsigned long)bb,.len=PG,.mode=UFFDIO_COPY_MODE_DONTWAKE};
        if(ioctl(uffd,UFFDIO_COPY,&cp)){ r.r[0]=errno; break; } }
      r.d[0]=(now()-t)/n; r.d[1]=(cpu()-tc)/n;
      int pfd=syscall(SYS_pidfd_open,getpid(),0); struct iovec iv[32];
      t=now(); tc=cpu(); for(long k=0;k+32<=n;k+=32){ for(int j=0;j<32;j++) iv[j]=(struct iovec){cview+perm[k+j]*PG,PG};
        if(syscall(SYS_process_madvise,pfd,iv,32,MADV_DONTNEED,0)<0){ r.r[1]=errno; break; } }
      r.d[2]=(now()-t)/n; r.d[3]=(cpu()-tc)/n; close(pfd); free(perm); break; }
    }
    if(write(s,&r,sizeof r)!=sizeof r) _exit(0);
  }
}
// client: opens the uffd with `features`, maps view+pool (n pages each), registers both with `mode`
static void client(int s, long n, unsigned long features, unsigned long mode, int dontfork){
  pin(1);
  int uffd = syscall(SYS_userfaultfd, O_CLOEXEC|O_NONBLOCK);
  struct uffdio_api api={.api=UFFD_API,.features=features}; if(ioctl(uffd,UFFDIO_API,&api)) die("client api");
  cview = mmap(0,n*PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  cpool = mmap(0,n*PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); cn=n;
  madvise(cview,n*PG,MADV_NOHUGEPAGE); madvise(cpool,n*PG,MADV_NOHUGEPAGE);
  if(dontfork){ madvise(cview,n*PG,MADV_DONTFORK); madvise(cpool,n*PG,MADV_DONTFORK); }
  struct uffdio_register r={.range={(unsigned long)cview,n*PG},.mode=mode};
  if(ioctl(uffd,UFFDIO_REGISTER,&r)) die("client reg");
  r.range.start=(unsigned long)cpool; if(ioctl(uffd,UFFDIO_REGISTER,&r)) die("client reg2");
  struct hello h={(unsigned long)cview,(unsigned long)cpool,n,getpid()};
  send_fds(s,&uffd,1,&h,sizeof h);   // the client keeps its own copy of the uffd open
  client_loop(s,uffd,0);
}

// ---- daemon side ----
static int S, U, PIDFD; static struct hello H; static pid_t CPID; static char *BUF;
static struct rep call(int s,long op,long a,long b){ struct cmd c={op,a,b}; struct rep r;
  if(write(s,&c,sizeof c)!=sizeof c) die("call write"); if(read(s,&r,sizeof r)!=sizeof r) die("call read"); return r; }
static void start_client(long n, unsigned long features, unsigned long mode, int dontfork){
  int sp[2]; if(socketpair(AF_UNIX,SOCK_STREAM,0,sp)) die("socketpair");
  CPID=fork(); if(CPID==0){ close(sp[0]); client(sp[1],n,features,mode,dontfork); _exit(0);} close(sp[1]); S=sp[0];
  int fds[4]; if(recv_fds(S,fds,&H,sizeof H)!=1){fprintf(stderr,"no fd\n");exit(1);} U=fds[0];
  PIDFD=syscall(SYS_pidfd_open,CPID,0); if(PIDFD<0) die("pidfd_open");
}
static void stop_client(){ struct cmd c={OP_EXIT}; write(S,&c,sizeof c); waitpid(CPID,0,0); close(S); close(U); close(PIDFD); }
static long *perm_of(long n,int seed){ long*p=malloc(n*sizeof(long)); for(long i=0;i<n;i++)p[i]=i; srand(seed);
  for(long i=n-1;i>0;i--){long j=rand()%(i+1);long x=p[i];p[i]=p[j];p[j]=x;} return p; }
static int copy(int uffd,unsigned long dst,void*src,unsigned long len,int mode){
  struct uffdio_copy c={.dst=dst,.src=(unsigned long)src,.len=len,.mode=mode|UFFDIO_COPY_MODE_DONTWAKE};
  return ioctl(uffd,UFFDIO_COPY,&c)?errno:0; }
static int move(int uffd,unsigned long dst,unsigned long src,unsigned long len,long *moved){
  struct uffdio_move m={.dst=dst,.src=src,.len=len,.mode=UFFDIO_MOVE_MODE_DONTWAKE};
  int rc=ioctl(uffd,UFFDIO_MOVE,&m)?errno:0; if(moved)*moved=m.move; return rc; }
static int wprot(int uffd,unsigned long a,unsigned long len,int on){
  struct uffdio_writeprotect w={.range={a,len},.mode=(on?UFFDIO_WRITEPROTECT_MODE_WP:0)|(on?0:UFFDIO_WRITEPROTECT_MODE_DONTWAKE)};
  return ioctl(uffd,UFFDIO_WRITEPROTECT,&w)?errno:0; }
static void fill_view(long n){ for(long i=0;i<n;i+=64){ int e=copy(U,H.view+i*PG,BUF,64*PG,0); if(e&&e!=EEXIST){errno=e;die("fill");}} }
#define VIEW(i) (H.view+(unsigned long)(i)*PG)
#define POOL(i) (H.pool+(unsigned long)(i)*PG)

static void test_in(long n, int busy){
  start_client(n, 0, UFFDIO_REGISTER_MODE_MISSING, 1); call(S,OP_BUSY,busy,0);
  long *perm=perm_of(n,1); double t,tc;
  if(busy){ call(S,OP_BUSY,0,0); call(S,OP_BUSY,busy+1,0); }
  { struct rep q=call(S,OP_SELFCOPY,0,n); printf("in  busy=%d in-process COPY 1 page by the client    %6.2f us/page wall %6.2f cpu rc=%ld\n",busy,q.d[0]/1e3,q.d[1]/1e3,q.r[0]);
    printf("in  busy=%d in-process process_madvise(self) DONTNEED 32 scattered %6.2f us/page wall %6.2f cpu rc=%ld\n",busy,q.d[2]/1e3,q.d[3]/1e3,q.r[1]); call(S,OP_ZAP,0,n); }
  if(busy){ call(S,OP_BUSY,0,0); call(S,OP_BUSY,busy,0); }
  t=now(); tc=cpu(); for(long k=0;k<n;k++){int e=copy(U,VIEW(perm[k]),BUF,PG,0); if(e){errno=e;die("copy1");}}
  printf("in  busy=%d COPY 1 page (cross-mm, random)        %6.2f us/page wall %6.2f cpu\n",busy,(now()-t)/n/1e3,(cpu()-tc)/n/1e3);
  call(S,OP_ZAP,0,n);
  for(int run=16;run<=64;run*=4){ long nr=n/run; long*pr=perm_of(nr,2);
    t=now(); tc=cpu(); for(long k=0;k<nr;k++){int e=copy(U,VIEW(pr[k]*run),BUF,run*PG,0); if(e){errno=e;die("copyrun");}}
    printf("in  busy=%d COPY %2d-page runs                     %6.2f us/page wall %6.2f cpu\n",busy,run,(now()-t)/n/1e3,(cpu()-tc)/n/1e3); call(S,OP_ZAP,0,n); free(pr);}
  t=now(); tc=cpu(); for(long k=0;k<n;k++){struct uffdio_zeropage z={.range={VIEW(perm[k]),PG},.mode=UFFDIO_ZEROPAGE_MODE_DONTWAKE}; if(ioctl(U,UFFDIO_ZEROPAGE,&z))die("zp");}
  printf("in  busy=%d ZEROPAGE 1 page                        %6.2f us/page wall %6.2f cpu\n",busy,(now()-t)/n/1e3,(cpu()-tc)/n/1e3);
  call(S,OP_ZAP,0,n);
  t=now(); tc=cpu(); for(long k=0;k<n;k+=64){struct uffdio_zeropage z={.range={VIEW(k),64*PG},.mode=UFFDIO_ZEROPAGE_MODE_DONTWAKE}; if(ioctl(U,UFFDIO_ZEROPAGE,&z))die("zp64");}
  printf("in  busy=%d ZEROPAGE 64-page runs                  %6.2f us/page wall %6.2f cpu\n",busy,(now()-t)/n/1e3,(cpu()-tc)/n/1e3);
  call(S,OP_BUSY,0,0); stop_client(); free(perm);
}

// fault handler thread for the round trip: resolves MISSING by COPY and WP by clearing WP
static volatile int hstop; static int hmode_spin; static int hcpu; static long hfaults, hevents;
static void *handler(void *a){ pin(hcpu); struct uffd_msg m[32]; hfaults=0;
  while(!hstop){
    if(!hmode_spin){ struct pollfd p={U,POLLIN}; if(poll(&p,1,50)<=0) continue; }
    ssize_t r=read(U,m,sizeof m); if(r<=0) continue;
    for(int i=0;i<r/(ssize_t)sizeof(struct uffd_msg);i++){ if(m[i].event!=UFFD_EVENT_PAGEFAULT){ hevents++; continue; }
      unsigned long ad=m[i].arg.pagefault.address&~(PG-1); hfaults++;
      if(m[i].arg.pagefault.flags&UFFD_PAGEFAULT_FLAG_WP){ struct uffdio_writeprotect w={.range={ad,PG},.mode=0}; ioctl(U,UFFDIO_WRITEPROTECT,&w); }
      else { struct uffdio_copy c={.dst=ad,.src=(unsigned long)BUF,.len=PG}; ioctl(U,UFFDIO_COPY,&c); } } }
  return 0; }
static void rtt_one(const char*name,long n,int spin_,int dcpu,int ccpu,int wp){
  if(wp){ fill_view(n); if(wprot(U,H.view,n*PG,1)) die("wp all"); }
  call(S,OP_PIN,ccpu,0); hmode_spin=spin_; hcpu=dcpu; hstop=0; pthread_t th; pthread_create(&th,0,handler,0);
  pin(ccpu); // the waiting main thread leaves the handler's vCPU (a spinning SCHED_FIFO handler would starve it)
  struct rep r=call(S,wp?OP_WTOUCH:OP_TOUCH,0,n); hstop=1; pthread_join(th,0); pin(0);
  printf("rtt %-44s p50 %6.1f us  p99 %6.1f us  (%ld faults)\n",name,r.d[0]/1e3,r.d[1]/1e3,hfaults);
  call(S,OP_ZAP,0,n);
}
static void test_rtt(long n){
  start_client(n, UFFD_FEATURE_PAGEFAULT_FLAG_WP, UFFDIO_REGISTER_MODE_MISSING|UFFDIO_REGISTER_MODE_WP, 1);
  rtt_one("missing, daemon poll,  cross vCPU (d0,c1)",n,0,0,1,0);
  rtt_one("missing, daemon spin,  cross vCPU (d0,c1)",n,1,0,1,0);
  rtt_one("missing, daemon poll,  same vCPU (d0,c0)",n,0,0,0,0);
  rtt_one("wp,      daemon poll,  cross vCPU (d0,c1)",n,0,0,1,1);
  rtt_one("wp,      daemon spin,  cross vCPU (d0,c1)",n,1,0,1,1);
  stop_client();
}

static void test_out(long n, int busy){
  start_client(n, UFFD_FEATURE_MOVE|UFFD_FEATURE_PAGEFAULT_FLAG_WP, UFFDIO_REGISTER_MODE_MISSING|UFFDIO_REGISTER_MODE_WP, 1);
  call(S,OP_BUSY,busy,0); fill_view(n);
  long *perm=perm_of(n,3); double t,tc; struct iovec li[64], ri[64]; char *rb=malloc(64*PG);
  // read the bytes
  t=now(); tc=cpu(); for(long k=0;k<n;k++){ li[0]=(struct iovec){rb,PG}; ri[0]=(struct iovec){(void*)VIEW(perm[k]),PG};
    if(process_vm_readv(CPID,li,1,ri,1,0)!=PG) die("pvr1"); }
  printf("out busy=%d process_vm_readv 1 page                %6.2f us/page wall %6.2f cpu\n",busy,(now()-t)/n/1e3,(cpu()-tc)/n/1e3);
  t=now(); tc=cpu(); for(long k=0;k<n;k+=64){ li[0]=(struct iovec){rb,64*PG}; for(int j=0;j<64;j++) ri[j]=(struct iovec){(void*)VIEW(perm[k+j]),PG};
    if(process_vm_readv(CPID,li,1,ri,64,0)!=64*PG) die("pvr64"); }
  printf("out busy=%d process_vm_readv 64 scattered iovecs   %6.2f us/page wall %6.2f cpu\n",busy,(now()-t)/n/1e3,(cpu()-tc)/n/1e3);
  t=now(); tc=cpu(); for(long k=0;k<n;k+=64){ li[0]=(struct iovec){rb,64*PG}; ri[0]=(struct iovec){(void*)VIEW(k),64*PG};
    if(process_vm_readv(CPID,li,1,ri,1,0)!=64*PG) die("pvr64r"); }
  printf("out busy=%d process_vm_readv 64-page run           %6.2f us/page wall %6.2f cpu\n",busy,(now()-t)/n/1e3,(cpu()-tc)/n/1e3);
  // drop from outside
  for(int j=0;j<64;j++) ri[j]=(struct iovec){(void*)VIEW(perm[j]),PG};
  long rc=syscall(SYS_process_madvise,PIDFD,ri,1,MADV_DONTNEED,0);
  printf("out busy=%d process_madvise(pidfd, MADV_DONTNEED)  rc=%ld errno=%d (%s)\n",busy,rc,rc<0?errno:0,rc<0?strerror(errno):"ok");
  rc=syscall(SYS_process_madvise,PIDFD,ri,1,MADV_FREE,0);
  printf("out busy=%d process_madvise(pidfd, MADV_FREE)      rc=%ld errno=%d (%s)\n",busy,rc,rc<0?errno:0,rc<0?strerror(errno):"ok");
  int adv[2]={MADV_COLD,MADV_PAGEOUT}; const char*an[2]={"COLD","PAGEOUT"};
  for(int a=0;a<2;a++){ t=now(); tc=cpu(); long bad=0; for(long k=0;k<n;k+=64){ for(int j=0;j<64;j++) ri[j]=(struct iovec){(void*)VIEW(perm[k+j]),PG};
      if(syscall(SYS_process_madvise,PIDFD,ri,64,adv[a],0)<0){bad=errno;break;} }
    double dt=(now()-t)/n/1e3, dc=(cpu()-tc)/n/1e3;
    // is the page still resident? (pagemap of the client, bit 63)
    char pm[64]; snprintf(pm,64,"/proc/%d/pagemap",CPID); int f=open(pm,O_RDONLY); long pres=0;
    for(long i=0;i<n;i++){ uint64_t e; pread(f,&e,8,(H.view/PG+i)*8); pres+=(e>>63)&1; } close(f);
    printf("out busy=%d process_madvise(pidfd, MADV_%s) 64 scattered %6.2f us/page wall %6.2f cpu errno=%ld, resident after: %ld/%ld (no swap device)\n",busy,an[a],dt,dc,bad,pres,n); }
  // MOVE view -> pool, done by the daemon through the client's uffd
  long moved=0; int e=move(U,POOL(perm[0]),VIEW(perm[0]),PG,&moved);
  printf("out busy=%d UFFDIO_MOVE through client uffd: rc=%d (%s) moved=%ld\n",busy,e,e?strerror(e):"ok",moved);
  if(!e){ move(U,VIEW(perm[0]),POOL(perm[0]),PG,0);
    t=now(); tc=cpu(); for(long k=0;k<n;k++){ e=move(U,POOL(perm[k]),VIEW(perm[k]),PG,0); if(e){errno=e;die("move1");} }
    printf("out busy=%d UFFDIO_MOVE view->pool 1 page (in client) %6.2f us/page wall %6.2f cpu\n",busy,(now()-t)/n/1e3,(cpu()-tc)/n/1e3);
    t=now(); tc=cpu(); for(long k=0;k<n;k++){ e=move(U,VIEW(perm[k]),POOL(perm[k]),PG,0); if(e){errno=e;die("move1b");} }
    printf("out busy=%d UFFDIO_MOVE pool->view 1 page           %6.2f us/page wall %6.2f cpu\n",busy,(now()-t)/n/1e3,(cpu()-tc)/n/1e3);
    long nr=n/64; long*pr=perm_of(nr,4);
    t=now(); tc=cpu(); for(long k=0;k<nr;k++){ e=move(U,POOL(pr[k]*64),VIEW(pr[k]*64),64*PG,0); if(e){errno=e;die("move64");} }
    printf("out busy=%d UFFDIO_MOVE view->pool 64-page runs     %6.2f us/page wall %6.2f cpu\n",busy,(now()-t)/n/1e3,(cpu()-tc)/n/1e3);
    t=now(); tc=cpu(); for(long k=0;k<nr;k++){ e=move(U,VIEW(pr[k]*64),POOL(pr[k]*64),64*PG,0); if(e){errno=e;die("move64b");} }
    printf("out busy=%d UFFDIO_MOVE pool->view 64-page runs     %6.2f us/page wall %6.2f cpu\n",busy,(now()-t)/n/1e3,(cpu()-tc)/n/1e3); free(pr); }
  if(busy){ call(S,OP_BUSY,0,0); call(S,OP_BUSY,busy+1,0); }
  { struct rep q=call(S,OP_SELFMOVE,0,n); printf("out busy=%d in-process UFFDIO_MOVE by the client, view->pool 1 page %6.2f us/page wall %6.2f cpu rc=%ld\n",busy,q.d[0]/1e3,q.d[1]/1e3,q.r[0]);
    q=call(S,OP_SELFMOVE,-1,n); printf("out busy=%d in-process UFFDIO_MOVE by the client, pool->view 1 page %6.2f us/page wall %6.2f cpu rc=%ld\n",busy,q.d[0]/1e3,q.d[1]/1e3,q.r[0]); }
  if(busy){ call(S,OP_BUSY,0,0); call(S,OP_BUSY,busy,0); }
  // write-protect from the daemon (reference/dirty observation)
  t=now(); tc=cpu(); for(long k=0;k<n;k++){ e=wprot(U,VIEW(perm[k]),PG,1); if(e){errno=e;die("wp1");} }
  printf("out busy=%d UFFDIO_WRITEPROTECT set 1 page          %6.2f us/page wall %6.2f cpu\n",busy,(now()-t)/n/1e3,(cpu()-tc)/n/1e3);
  t=now(); tc=cpu(); for(long k=0;k<n;k++){ e=wprot(U,VIEW(perm[k]),PG,0); if(e){errno=e;die("wp1c");} }
  printf("out busy=%d UFFDIO_WRITEPROTECT clear 1 page        %6.2f us/page wall %6.2f cpu\n",busy,(now()-t)/n/1e3,(cpu()-tc)/n/1e3);
  t=now(); tc=cpu(); for(long k=0;k<n;k+=64){ e=wprot(U,VIEW(k),64*PG,1); if(e){errno=e;die("wp64");} }
  printf("out busy=%d UFFDIO_WRITEPROTECT set 64-page runs    %6.2f us/page wall %6.2f cpu\n",busy,(now()-t)/n/1e3,(cpu()-tc)/n/1e3);
  wprot(U,H.view,n*PG,0);
  call(S,OP_BUSY,0,0); stop_client(); free(perm); free(rb);
}

static uint64_t pm_entry(pid_t pid,unsigned long addr){ char p[64]; snprintf(p,64,"/proc/%d/pagemap",pid);
  int f=open(p,O_RDONLY); uint64_t e=0; pread(f,&e,8,addr/PG*8); close(f); return e; }
static void pm_show(const char*who,pid_t pid,long i){ uint64_t e=pm_entry(pid,VIEW(i));
  printf("    %-7s page %3ld: present=%d excl=%d uffd_wp=%d pfn=%#llx\n",who,i,(int)(e>>63&1),(int)(e>>56&1),(int)(e>>57&1),(unsigned long long)(e&((1ULL<<55)-1))); }
// wait up to ms for one message on uffd u; returns 1 and fills m, or 0
static int get_msg(int u,struct uffd_msg*m,int ms){ struct pollfd p={u,POLLIN}; if(poll(&p,1,ms)<=0) return 0; return read(u,m,sizeof *m)==sizeof *m; }
static const char*evname(int e){ switch(e){case UFFD_EVENT_PAGEFAULT:return"PAGEFAULT";case UFFD_EVENT_FORK:return"FORK";case UFFD_EVENT_REMAP:return"REMAP";case UFFD_EVENT_REMOVE:return"REMOVE";case UFFD_EVENT_UNMAP:return"UNMAP";} return "?"; }
// send a command to a client and serve events on uffd u meanwhile (the client may block on one)
static struct rep call_serving(int s,int u,long op,long a,long b,const char*who){
  struct cmd c={op,a,b}; struct rep r; write(s,&c,sizeof c);
  for(;;){ struct pollfd p[2]={{s,POLLIN},{u,POLLIN}}; poll(p,2,2000);
    if(p[1].revents&POLLIN){ struct uffd_msg m; if(read(u,&m,sizeof m)==sizeof m){
        printf("    %s's uffd: event %s",who,evname(m.event));
        if(m.event==UFFD_EVENT_PAGEFAULT){ unsigned long ad=m.arg.pagefault.address&~(PG-1);
          printf(" %s page %ld", m.arg.pagefault.flags&UFFD_PAGEFAULT_FLAG_WP?"WP":"MISSING",(long)((ad-H.view)/PG));
          if(m.arg.pagefault.flags&UFFD_PAGEFAULT_FLAG_WP){ struct uffdio_writeprotect w={.range={ad,PG}}; printf(" -> clear WP rc=%d",ioctl(u,UFFDIO_WRITEPROTECT,&w)?errno:0);}
          else { memset(BUF,'C',PG); printf(" -> COPY rc=%d",copy(u,ad,BUF,PG,0)); struct uffdio_range wr={ad,PG}; ioctl(u,UFFDIO_WAKE,&wr);} }
        if(m.event==UFFD_EVENT_REMOVE||m.event==UFFD_EVENT_UNMAP) printf(" [%ld,%ld)",(long)((m.arg.remove.start-H.view)/PG),(long)((m.arg.remove.end-H.view)/PG));
        if(m.event==UFFD_EVENT_REMAP) printf(" from page %ld len %ld pages",(long)((m.arg.remap.from-H.view)/PG),(long)(m.arg.remap.len/PG));
        printf("\n"); } }
    if(p[0].revents&POLLIN){ if(read(s,&r,sizeof r)!=sizeof r) die("reply"); return r; } }
}
static void test_fork(long nbig, long nres){
  unsigned long feat=UFFD_FEATURE_EVENT_FORK|UFFD_FEATURE_EVENT_REMAP|UFFD_FEATURE_EVENT_REMOVE|UFFD_FEATURE_EVENT_UNMAP|UFFD_FEATURE_MOVE|UFFD_FEATURE_PAGEFAULT_FLAG_WP;
  start_client(nbig, feat, UFFDIO_REGISTER_MODE_MISSING|UFFDIO_REGISTER_MODE_WP, 0);
  // pages 0-15 resident writable (COPY), 16-31 resident COPY(MODE_WP), 32-63 missing, 64.. resident (64-page COPYs)
  memset(BUF,'A',64*PG); copy(U,VIEW(0),BUF,16*PG,0); copy(U,VIEW(16),BUF,16*PG,UFFDIO_COPY_MODE_WP);
  for(long i=64;i<nres&&i<nbig;i+=64) copy(U,VIEW(i),BUF,64*PG,0);
  printf("fork: client %d, %ld pages registered MISSING|WP, not DONTFORK; pages 0-15 COPY, 16-31 COPY(WP), 32-63 missing, 64-%ld COPY, rest missing\n",CPID,nbig,(nres<nbig?nres:nbig)-1);
  struct cmd c={OP_FORK}; write(S,&c,sizeof c); double t0=now();
  struct uffd_msg m; int got=get_msg(U,&m,5000); double t1=now();
  int cu=-1; if(got&&m.event==UFFD_EVENT_FORK){ cu=m.arg.fork.ufd; }
  printf("  daemon read event %s after %.1f us; child uffd = fd %d (installed in the daemon by read())\n",got?evname(m.event):"none",(t1-t0)/1e3,cu);
  struct rep r; int cs; { int fds[4]; recv_fds(S,fds,&r,sizeof r); cs=fds[0]; }
  pid_t ch=r.r[0]; printf("  fork() in the client took %.1f us (child %d)\n",r.d[0]/1e3,ch);
  struct uffdio_api api={.api=UFFD_API}; printf("  UFFDIO_API on the child's uffd: rc=%d (already initialised: features inherited)\n",ioctl(cu,UFFDIO_API,&api)?errno:0);
  printf("  pagemap after fork:\n"); for(int i=0;i<3;i++){ long pg[]={0,16,32}; pm_show("parent",CPID,pg[i]); pm_show("child",ch,pg[i]); }
  long moved=0; int e=move(U,POOL(0),VIEW(0),PG,&moved); printf("  UFFDIO_MOVE (parent uffd) of COW-shared page 0 -> pool: rc=%d (%s)\n",e,e?strerror(e):"ok");
  e=move(cu,POOL(1),VIEW(1),PG,&moved); printf("  UFFDIO_MOVE (child uffd) of COW-shared page 1 -> pool: rc=%d (%s)\n",e,e?strerror(e):"ok");
  memset(BUF,'D',PG); e=copy(cu,VIEW(2),BUF,PG,0); printf("  UFFDIO_COPY into the child at present page 2: rc=%d (%s)\n",e,e?strerror(e):"ok");
  e=copy(cu,VIEW(40),BUF,PG,0); printf("  UFFDIO_COPY into the child at missing page 40: rc=%d (%s)\n",e,e?strerror(e):"ok");
  pm_show("parent",CPID,40); pm_show("child",ch,40);
  printf("  child reads page 40 (daemon-copied 'D'):\n"); r=call_serving(cs,cu,OP_READ,40,0,"child"); printf("    -> %c in %.1f us\n",(int)r.r[0],r.d[0]/1e3);
  printf("  child writes page 3 (COW-shared, writable in parent before fork):\n"); r=call_serving(cs,cu,OP_WRITE,3,'x',"child"); printf("    -> %.1f us\n",r.d[0]/1e3);
  pm_show("parent",CPID,3); pm_show("child",ch,3);
  printf("  child writes page 17 (COW-shared, uffd-wp before fork):\n"); r=call_serving(cs,cu,OP_WRITE,17,'y',"child"); printf("    -> %.1f us\n",r.d[0]/1e3);
  pm_show("parent",CPID,17); pm_show("child",ch,17);
  printf("  parent writes page 4 (COW-shared):\n"); r=call_serving(S,U,OP_WRITE,4,'z',"parent"); printf("    -> %.1f us\n",r.d[0]/1e3);
  pm_show("parent",CPID,4); pm_show("child",ch,4);
  { struct rep q=call(S,OP_SELFMOVE,0,1); printf("  in-process UFFDIO_MOVE by the parent itself of page 0 (random pick of 1 page => page 0), COW-shared: rc=%ld (%s)\n",q.r[0],strerror(q.r[0])); }
  e=move(U,POOL(5),VIEW(5),PG,&moved); printf("  UFFDIO_MOVE (parent) of page 5, still shared: rc=%d (%s)\n",e,e?strerror(e):"ok");
  e=move(cu,POOL(3),VIEW(3),PG,&moved); printf("  UFFDIO_MOVE (child) of page 3 after the child's COW (now exclusive): rc=%d (%s)\n",e,e?strerror(e):"ok");
  e=move(U,POOL(3),VIEW(3),PG,&moved); printf("  UFFDIO_MOVE (parent) of page 3 after the child's COW (parent's now exclusive? ): rc=%d (%s)\n",e,e?strerror(e):"ok");
  { char v[2]; struct iovec li={v,1}, ri={(void*)VIEW(3),1}; process_vm_readv(ch,&li,1,&ri,1,0); ri.iov_base=(void*)VIEW(17); li.iov_base=v+1; process_vm_readv(ch,&li,1,&ri,1,0);
    printf("  child's pages 3,17 read by process_vm_readv: '%c' '%c'\n",v[0],v[1]); }
  printf("  child reads page 50 (missing in both):\n"); r=call_serving(cs,cu,OP_READ,50,0,"child"); printf("    -> %c in %.1f us\n",(int)r.r[0],r.d[0]/1e3);
  printf("  child madvise(DONTNEED) pages 8-11:\n"); r=call_serving(cs,cu,OP_DONTNEED,8,4,"child"); printf("    -> rc=%ld %.1f us\n",r.r[0],r.d[0]/1e3);
  printf("  child mremap pages 12-13:\n"); r=call_serving(cs,cu,OP_MREMAP,12,2,"child"); printf("    -> rc=%ld %.1f us\n",r.r[0],r.d[0]/1e3);
  printf("  child munmap pages 60-63:\n"); r=call_serving(cs,cu,OP_MUNMAP,60,4,"child"); printf("    -> rc=%ld %.1f us\n",r.r[0],r.d[0]/1e3);
  // the child exits: what does its uffd show?
  struct cmd x={OP_EXIT}; write(cs,&x,sizeof x); waitpid(ch,0,0);
  struct pollfd p={cu,POLLIN}; int pr=poll(&p,1,200);
  e=copy(cu,VIEW(41),BUF,PG,0); printf("  after the child exited: poll(child uffd)=%d revents=%#x, UFFDIO_COPY rc=%d (%s)\n",pr,p.revents,e,strerror(e));
  close(cu); close(cs);
  // fork timing with everything resident (the daemon reads the fork event at once, spinning)
  double ft[5]; for(int k=0;k<5;k++){ struct cmd f={OP_FORKTIME}; write(S,&f,sizeof f);
    for(;;){ ssize_t n=read(U,&m,sizeof m); if(n==sizeof m){ if(m.event==UFFD_EVENT_FORK) close(m.arg.fork.ufd); break; } }
    read(S,&r,sizeof r); ft[k]=r.d[0]/1e3; }
  qsort(ft,5,sizeof(double),cmpd);
  printf("  fork() of the client, %ld MiB registered (EVENT_FORK), %ld MiB resident, 5 forks: median %.0f us [%.0f-%.0f]\n",nbig*PG>>20,(nres<nbig?nres:nbig)*PG>>20,ft[2],ft[0],ft[4]);
  for(int k=0;k<5;k++){ struct cmd f={OP_PLAINFORK,nres<nbig?nres:nbig}; write(S,&f,sizeof f);
    for(;;){ ssize_t n=read(U,&m,sizeof m); if(n==sizeof m){ if(m.event==UFFD_EVENT_FORK) close(m.arg.fork.ufd); break; } }
    read(S,&r,sizeof r); ft[k]=r.d[0]/1e3; } qsort(ft,5,sizeof(double),cmpd);
  printf("  fork() with an extra plain %ld MiB anon mapping populated (+ the registered one), 5 forks: median %.0f us [%.0f-%.0f]\n",(nres<nbig?nres:nbig)*PG>>20,ft[2],ft[0],ft[4]);
  // daemon dies: the client kept its own copy of the uffd, so faults must block, not read zeros
  close(U); U=-1; printf("  daemon closed its uffd copy (client still holds one); client reads missing page 33...\n");
  { struct cmd rd={OP_READ,33}; write(S,&rd,sizeof rd); struct pollfd q={S,POLLIN}; int rr=poll(&q,1,500);
    if(rr>0){ read(S,&r,sizeof r); printf("    -> returned '%c' (%d) in %.1f us\n",(int)r.r[0],(int)r.r[0],r.d[0]/1e3);} else printf("    -> still blocked after 500 ms (fault queued on the client's own fd)\n"); }
  kill(CPID,SIGKILL); waitpid(CPID,0,0); close(S); close(PIDFD);
  // and without the client's copy: it closes its fd, then the daemon closes its
  start_client(64, feat, UFFDIO_REGISTER_MODE_MISSING, 1); call(S,OP_CLOSEUFFD,0,0); close(U);
  r=call(S,OP_READ,33,0); printf("  client and daemon both closed the uffd: client reads missing page 33 -> %d (zero fill, the range is unregistered)\n",(int)r.r[0]);
  struct cmd ex={OP_EXIT}; write(S,&ex,sizeof ex); waitpid(CPID,0,0);
}

// the client's own batched drop when its uffd has EVENT_REMOVE: each range is a REMOVE event the daemon must read
static void test_drop(long n){
  start_client(n, UFFD_FEATURE_EVENT_REMOVE|UFFD_FEATURE_PAGEFAULT_FLAG_WP, UFFDIO_REGISTER_MODE_MISSING|UFFDIO_REGISTER_MODE_WP, 1);
  for(int sp=0;sp<2;sp++){ hmode_spin=sp; hcpu=0; hstop=0; hevents=0; pthread_t th; pthread_create(&th,0,handler,0);
    struct rep q=call(S,OP_SELFCOPY,0,n); hstop=1; pthread_join(th,0);
    printf("drop EVENT_REMOVE on, daemon %s: client process_madvise(self) DONTNEED 32 scattered %6.2f us/page wall %6.2f cpu rc=%ld (%ld REMOVE events)\n",
      sp?"spin":"poll",q.d[2]/1e3,q.d[3]/1e3,q.r[1],hevents); }
  stop_client(); }

// swap-out without MOVE: daemon write-protects, reads the bytes, the client's own thread drops the page while a
// writer is held in its wp fault; the daemon then wakes the writer, which must refault MISSING and find the bytes
static void test_race(void){
  start_client(64, UFFD_FEATURE_PAGEFAULT_FLAG_WP, UFFDIO_REGISTER_MODE_MISSING|UFFDIO_REGISTER_MODE_WP, 1);
  memset(BUF,'A',PG); copy(U,VIEW(0),BUF,PG,0); int e=wprot(U,VIEW(0),PG,1);
  static char save[4096]; struct iovec li={save,PG}, ri={(void*)VIEW(0),PG}; long n=process_vm_readv(CPID,&li,1,&ri,1,0);
  printf("race: daemon WP page 0 rc=%d, read %ld bytes ('%c')\n",e,n,save[0]);
  call(S,OP_AWRITE,0,0); struct uffd_msg m; int got=get_msg(U,&m,2000);
  printf("  client thread writes page 0: daemon got %s%s (held)\n",got?evname(m.event):"nothing",got&&(m.arg.pagefault.flags&UFFD_PAGEFAULT_FLAG_WP)?" WP":"");
  struct rep r=call(S,OP_DONTNEED,0,1); printf("  client's agent madvise(DONTNEED) page 0 while the writer is held: rc=%ld; present=%d\n",r.r[0],(int)(pm_entry(CPID,VIEW(0))>>63));
  struct uffdio_range wr={VIEW(0),PG}; e=ioctl(U,UFFDIO_WAKE,&wr)?errno:0; got=get_msg(U,&m,2000);
  printf("  daemon UFFDIO_WAKE rc=%d; then got %s%s\n",e,got?evname(m.event):"nothing",got?((m.arg.pagefault.flags&UFFD_PAGEFAULT_FLAG_WP)?" WP":" MISSING"):"");
  if(got&&m.event==UFFD_EVENT_PAGEFAULT){ struct uffdio_copy c={.dst=VIEW(0),.src=(unsigned long)save,.len=PG}; e=ioctl(U,UFFDIO_COPY,&c)?errno:0; printf("  daemon COPYs the saved bytes back: rc=%d\n",e); }
  usleep(20000); r=call(S,OP_READ,0,0); char b1; li=(struct iovec){&b1,1}; ri=(struct iovec){(void*)(VIEW(0)+1),1}; process_vm_readv(CPID,&li,1,&ri,1,0);
  printf("  page 0 now: byte 0 '%c' (the write landed), byte 1 '%c' (the saved bytes)\n",(int)r.r[0],b1);
  stop_client(); }

// fork with a uffd that has no EVENT_FORK (what an unprivileged client gets): the kernel unregisters the child's copy
static void test_fork2(void){
  start_client(64, UFFD_FEATURE_PAGEFAULT_FLAG_WP|UFFD_FEATURE_MOVE, UFFDIO_REGISTER_MODE_MISSING|UFFDIO_REGISTER_MODE_WP, 0);
  memset(BUF,'A',64*PG); copy(U,VIEW(0),BUF,16*PG,0); copy(U,VIEW(16),BUF,16*PG,UFFDIO_COPY_MODE_WP);
  printf("fork2: uffd without EVENT_FORK, regions not DONTFORK; pages 0-15 COPY, 16-31 COPY(WP), 32-63 missing\n");
  struct cmd c={OP_FORK2}; write(S,&c,sizeof c); struct rep r,h; int fds[4];
  recv_fds(S,fds,&r,sizeof r); int cs=fds[0]; recv_fds(cs,fds,&h,sizeof h); int cu=fds[0]; pid_t ch=r.r[0];
  printf("  fork() took %.1f us (no event, nothing waits for the daemon); child read missing page 51 BEFORE re-registering: %ld (silent zero page)\n",r.d[0]/1e3,h.r[0]);
  printf("  child re-registered its view with a new uffd: rc=%ld, sent fd %d\n",h.r[1],cu);
  for(int i=0;i<3;i++){ long pg[]={0,16,51}; pm_show("parent",CPID,pg[i]); pm_show("child",ch,pg[i]); }
  printf("  child reads page 50 (missing in both):\n"); r=call_serving(cs,cu,OP_READ,50,0,"child"); printf("    -> %c in %.1f us\n",(int)r.r[0],r.d[0]/1e3);
  printf("  child writes page 17 (uffd-wp in the parent):\n"); r=call_serving(cs,cu,OP_WRITE,17,'y',"child"); printf("    -> %.1f us\n",r.d[0]/1e3);
  pm_show("parent",CPID,17); pm_show("child",ch,17);
  int e=wprot(cu,VIEW(3),PG,1); printf("  daemon write-protects the child's COW-shared page 3 through the new uffd: rc=%d\n",e);
  printf("  child writes page 3:\n"); r=call_serving(cs,cu,OP_WRITE,3,'x',"child"); printf("    -> %.1f us\n",r.d[0]/1e3);
  pm_show("parent",CPID,3); pm_show("child",ch,3);
  struct cmd x={OP_EXIT}; write(cs,&x,sizeof x); waitpid(ch,0,0); close(cs); close(cu); stop_client(); }

// which uffd features an unprivileged user (uid 65534, vm.unprivileged_userfaultfd=0 => UFFD_USER_MODE_ONLY) may ask for
static void test_priv(void){
  pid_t p=fork(); if(p==0){ if(setgid(65534)||setuid(65534)) die("setuid");
    unsigned long fs[]={UFFD_FEATURE_EVENT_FORK, UFFD_FEATURE_EVENT_REMAP|UFFD_FEATURE_EVENT_REMOVE|UFFD_FEATURE_EVENT_UNMAP,
      UFFD_FEATURE_MOVE|UFFD_FEATURE_PAGEFAULT_FLAG_WP};
    const char*nm[]={"EVENT_FORK","EVENT_REMAP|REMOVE|UNMAP","MOVE|PAGEFAULT_FLAG_WP"};
    for(int i=0;i<3;i++){ int u=syscall(SYS_userfaultfd,O_CLOEXEC|O_NONBLOCK|1/*UFFD_USER_MODE_ONLY*/);
      if(u<0){ printf("priv uid 65534: userfaultfd(UFFD_USER_MODE_ONLY): errno %d (%s)\n",errno,strerror(errno)); continue; }
      struct uffdio_api api={.api=UFFD_API,.features=fs[i]}; int rc=ioctl(u,UFFDIO_API,&api);
      printf("priv uid 65534: UFFDIO_API features %-26s rc=%d errno=%d (%s)\n",nm[i],rc,rc?errno:0,rc?strerror(errno):"ok"); close(u); }
    _exit(0); }
  waitpid(p,0,0); }

int main(int argc,char**argv){ setvbuf(stdout,0,_IONBF,0); signal(SIGPIPE,SIG_IGN);
  const char*what=argc>1?argv[1]:"all"; int busy=argc>2?atoi(argv[2]):0;
  pin(0); BUF=mmap(0,64*PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE,-1,0); memset(BUF,'B',64*PG);
  long N=16384;
  if(!strcmp(what,"all")||!strcmp(what,"in")) test_in(N,busy);
  if(!strcmp(what,"all")||!strcmp(what,"rtt")) test_rtt(4096);
  if(!strcmp(what,"all")||!strcmp(what,"out")) test_out(N,busy);
  if(!strcmp(what,"all")||!strcmp(what,"drop")) test_drop(4096);
  if(!strcmp(what,"all")||!strcmp(what,"race")) test_race();
  if(!strcmp(what,"all")||!strcmp(what,"priv")) test_priv();
  if(!strcmp(what,"all")||!strcmp(what,"fork2")) test_fork2();
  if(!strcmp(what,"all")||!strcmp(what,"fork")) test_fork(argc>3?atol(argv[3]):65536, argc>4?atol(argv[4]):(argc>3?atol(argv[3]):65536));
  return 0; }
