/*
 * The pod sandbox's process for the real node (localhost/tether-test/pause:1): it holds the pod's
 * namespaces and does nothing else. As the sandbox's PID 1 it reaps orphaned children (a
 * shared-PID pod's exited processes would stay zombies otherwise) and exits 0 on SIGINT or
 * SIGTERM, which is how containerd stops a sandbox gracefully.
 *
 * Built static (gcc -static -Os -s) so the image needs no libc: interop/node/build.sh.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signo)
{
	(void)signo;
	_exit(0);
}

static void reap(int signo)
{
	int saved = errno;
	(void)signo;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = saved;
}

static void on(int signo, void (*handler)(int))
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = handler;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART | (signo == SIGCHLD ? SA_NOCLDSTOP : 0);
	if (sigaction(signo, &sa, NULL) < 0) {
		perror("pause: sigaction");
		exit(1);
	}
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("pause (tether-test) 1");
		return 0;
	}
	if (getpid() != 1)
		fputs("pause: warning: not PID 1, orphaned children are not reaped here\n", stderr);
	on(SIGINT, stop);
	on(SIGTERM, stop);
	on(SIGCHLD, reap);
	for (;;)
		pause();
}
