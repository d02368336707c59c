/* Numbers inside bounds (src/grammar/numrange.c): a digit automaton that accepts exactly the
 * integers, or the decimals of at most 16 fraction digits, in a closed range
 * (docs/architecture.md §9, "Numeric bounds"). */
#ifndef TL_GRAMMAR_NUMRANGE_H
#define TL_GRAMMAR_NUMRANGE_H

#include "grammar/build.h"

typedef __int128 tl_i128;

#define TL_NUM_UNIT ((tl_i128)10000000000000000LL) /* 10^16: one unit of an integer part */
/* Largest magnitude written: 16 integer digits (and, for number, 16 fraction digits). */
#define TL_NUM_MAX_INT ((tl_i128)9999999999999999LL)
#define TL_NUM_MAX_DEC (TL_NUM_UNIT * TL_NUM_UNIT - 1)

/* The rule of the values v with lo <= v <= hi, written as JSON numbers of the output policy
 * without exponent: -?(0|[1-9][0-9]{0,15}) and, for a number, an optional fraction of 1-16
 * digits (trailing zeros allowed). For an integer lo/hi are the values; for a number they are
 * the values times 10^16. "-0" (and "-0.0...") is accepted exactly when 0 is in the range.
 * Requires lo <= hi and both within +-TL_NUM_MAX_INT (integer) or +-TL_NUM_MAX_DEC (number). */
int tl_num_range_rule(tl_gbuild *b, int integer, tl_i128 lo, tl_i128 hi);

/* floor (up = 0) or ceil (up = 1) of d * 10^scale (scale 0 or 16), d finite; |d| is clamped to
 * 1e17 first (beyond every value written). Exact: d's full decimal expansion is used. */
tl_i128 tl_num_scale_double(double d, int scale, int up);

#endif
