/* One socketpair stage of the shim's data path, measured alone: how fast a writer moves bytes
 * from a 1 MiB buffer (the ring) through an AF_UNIX stream socketpair to a reading thread.
 * Recorded in docs/benchmarks.md ("The receive side's copy into the socketpair").
 *
 *   cc -O2 -o /tmp/stage tests/softroce/benches/socketpair_stage.c -lpthread
 *   /tmp/stage 2 0        semantics: is a vmsplice+splice zero-copy (the reader sees bytes
 *                         changed after the splice)? what SIOCOUTQ says while the reader reads
 *   /tmp/stage 0 MIB      write() of 256 KiB pieces (a copy into the socket, as the engine does)
 *   /tmp/stage 1 MIB      vmsplice() of the same pieces into a pipe, splice() into the socket
 *
 * In the Soft-RoCE guest: put the two commands in a script and run it with
 *   cargo run -p rdma-streams-softroce --example guest -- -- bash SCRIPT
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/mman.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <time.h>
static int rd;
static size_t total;
static void *reader(void *a){ char *b=malloc(1<<20); size_t got=0; while(got<total){ssize_t n=read(rd,b,1<<20); if(n<=0)break; got+=n;} return (void*)got; }
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){
  int mode=atoi(argv[1]); total=(size_t)atol(argv[2])<<20; size_t chunk=256<<10;
  int sv[2]; socketpair(AF_UNIX,SOCK_STREAM,0,sv); rd=sv[1];
  char *ring=mmap(0,1<<20,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); memset(ring,'a',1<<20);
  if(mode==2){ /* semantics check: splice then overwrite, read */
    int p[2]; pipe(p); struct iovec v={ring,4096}; ssize_t a=vmsplice(p[1],&v,1,0); ssize_t b=splice(p[0],0,sv[0],0,4096,0);
    int q; ioctl(sv[0],SIOCOUTQ,&q); printf("vmsplice %zd splice %zd outq %d\n",a,b,q);
    memset(ring,'b',4096); char x[4096]; read(sv[1],x,4096); printf("reader sees %c (a=copied, b=zero-copy)\n",x[0]);
    ioctl(sv[0],SIOCOUTQ,&q); printf("outq after read %d\n",q);
    /* partial reads */
    v.iov_base=ring; v.iov_len=65536; vmsplice(p[1],&v,1,0); b=splice(p[0],0,sv[0],0,65536,0); ioctl(sv[0],SIOCOUTQ,&q); printf("64k spliced %zd outq %d\n",b,q);
    int q2; read(sv[1],x,4096); ioctl(sv[0],SIOCOUTQ,&q2); printf("after 4k read outq %d\n",q2);
    while(1){ int inq; ioctl(sv[1],FIONREAD,&inq); if(!inq)break; read(sv[1],x,inq>4096?4096:inq); ioctl(sv[0],SIOCOUTQ,&q2); printf(" inq %d -> outq %d\n",inq,q2);} 
    return 0; }
  pthread_t t; pthread_create(&t,0,reader,0);
  int p[2]; pipe(p); fcntl(p[1],F_SETPIPE_SZ,1<<20);
  double t0=now(); size_t sent=0, off=0;
  while(sent<total){
    if(mode==0){ ssize_t n=write(sv[0],ring+off,chunk); sent+=n; off=(off+n)%(1<<20); }
    else { struct iovec v={ring+off,chunk}; ssize_t n=vmsplice(p[1],&v,1,0); if(n<=0){perror("vmsplice");return 1;} ssize_t m=0; while(m<n){ssize_t k=splice(p[0],0,sv[0],0,n-m,0); if(k<=0){perror("splice");return 1;} m+=k;} sent+=n; off=(off+n)%(1<<20); }
  }
  void *got; pthread_join(t,&got); double dt=now()-t0;
  printf("mode %d: %zu MiB in %.3f s = %.1f MiB/s\n",mode,(size_t)got>>20,dt,((size_t)got>>20)/dt);
}
