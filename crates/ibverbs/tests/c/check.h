/* What the C programs in tests/c share: CHECK fails the program with the
 * line, a message and errno; say prints a step's line for the test that
 * drives the program (stdout, flushed at once). */
#ifndef SOFTRDMA_TEST_CHECK_H
#define SOFTRDMA_TEST_CHECK_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c, ...)                                                          \
	do {                                                                   \
		if (!(c)) {                                                    \
			fprintf(stderr, "FAIL line %d: ", __LINE__);           \
			fprintf(stderr, __VA_ARGS__);                          \
			fprintf(stderr, " (errno %d: %s)\n", errno,            \
				strerror(errno));                              \
			exit(1);                                               \
		}                                                              \
	} while (0)

static inline void say(const char *s)
{
	printf("%s\n", s);
	fflush(stdout);
}

#endif
