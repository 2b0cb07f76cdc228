/* A process-directed signal under the shim goes to the app's threads only.
 *
 *   signals ADDR PORT
 *
 * listens on ADDR:PORT (under the shim, a capable listen starts its engine thread and the
 * thread that serves fork children), blocks SIGUSR1 in the main thread, sends the process
 * SIGUSR1 and waits: no other thread may run the handler (the shim's threads block every
 * signal). Once the main thread unblocks it, the handler runs there. Prints `ok: ...` and
 * exits 0, or says what went wrong and exits 1. Without the shim's threads (fewer than 2
 * threads) the check proves nothing: exit 2.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile pid_t handled_on;

static void on_usr1(int sig) {
    (void)sig;
    handled_on = (pid_t)syscall(SYS_gettid);
}

static int threads(void) {
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    if (d == NULL) return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
        return 2;
    }
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((unsigned short)atoi(argv[2]));
    int one = 1, ls = socket(AF_INET, SOCK_STREAM, 0);
    if (ls < 0 || inet_pton(AF_INET, argv[1], &sa.sin_addr) != 1 ||
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(ls, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(ls, 8) != 0) {
        perror("listen");
        return 1;
    }
    int n = threads();
    if (n < 2) {
        printf("only %d thread: the shim started none, nothing to check\n", n);
        return 2;
    }
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = on_usr1;
    sigemptyset(&act.sa_mask);
    sigaction(SIGUSR1, &act, NULL);
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, NULL);
    kill(getpid(), SIGUSR1);
    usleep(300000);
    if (handled_on != 0) {
        printf("SIGUSR1, blocked by the main thread %d, was handled on thread %d (of %d)\n",
               (int)syscall(SYS_gettid), (int)handled_on, n);
        return 1;
    }
    pthread_sigmask(SIG_UNBLOCK, &usr1, NULL);
    if (handled_on != (pid_t)syscall(SYS_gettid)) {
        printf("SIGUSR1 was not handled on the main thread once it unblocked it\n");
        return 1;
    }
    printf("ok: %d threads; the signal waited for the main thread\n", n);
    close(ls);
    return 0;
}
