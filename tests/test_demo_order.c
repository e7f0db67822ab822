/*
 * test_demo_order — the order the demo runs its policies in
 * (kvti_demo_order()): every group's order is a permutation; over any n
 * consecutive groups every policy runs in every position once (and, for
 * an even n, follows every other policy once), so a rate's repeats
 * (groups rep + k) never run a policy in the same position twice within n — the defect
 * this replaced: reversed every other group, with four rates a rate's
 * repeats all ran in one order (kvtier last at 4 sessions/s every time).
 */
#include "harness.h"
#include "demo/demo_impl.h"

#define NMAX 8

static void test_square(uint32_t n)
{
	uint32_t period = n, reps = 1;
	uint32_t pos[NMAX][NMAX] = { { 0 } }, follow[NMAX][NMAX] = { { 0 } };

	for (uint32_t row = 0; row < period; row++) {
		uint32_t seen = 0, prev = 0;

		for (uint32_t j = 0; j < n; j++) {
			uint32_t x = kvti_demo_order(n, row, j);

			CHECK(x < n);
			if (x >= n)
				return;
			CHECK(!(seen & (1u << x)));
			seen |= 1u << x;
			pos[x][j]++;
			if (j)
				follow[prev][x]++;
			prev = x;
			/* the rows repeat with the period */
			CHECK_EQ(kvti_demo_order(n, row + period, j), x);
		}
		CHECK_EQ(seen, (1u << n) - 1);
	}
	for (uint32_t a = 0; a < n; a++)
		for (uint32_t b = 0; b < n; b++) {
			CHECK_EQ(pos[a][b], reps);
			if (a != b && !(n & 1))
				CHECK_EQ(follow[a][b], reps);
		}
	/* n consecutive groups (a rate's first n repeats): each policy in n
	 * different positions */
	for (uint32_t k = 0; k < period; k++)
		for (uint32_t x = 0; x < n; x++) {
			uint32_t at = 0;

			for (uint32_t rep = 0; rep < n; rep++)
				for (uint32_t j = 0; j < n; j++)
					if (kvti_demo_order(n, k + rep, j) == x)
						at |= 1u << j;
			CHECK_EQ(at, (1u << n) - 1);
		}
}

int main(void)
{
	CHECK_EQ(kvti_demo_order(1, 5, 0), 0);
	for (uint32_t n = 2; n <= NMAX; n++)
		test_square(n);
	/* the demo's four policies: rows 0..3 */
	{
		static const uint32_t want[4][4] = {
			{ 0, 1, 3, 2 }, { 1, 2, 0, 3 },
			{ 2, 3, 1, 0 }, { 3, 0, 2, 1 },
		};

		for (uint32_t r = 0; r < 4; r++)
			for (uint32_t j = 0; j < 4; j++)
				CHECK_EQ(kvti_demo_order(4, r, j), want[r][j]);
	}
	TEST_DONE();
}
