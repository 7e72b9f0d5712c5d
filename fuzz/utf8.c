/* fuzz/utf8.c: utf8_repair() (csrc/core/utf8.c, built alone with -DCORRAL_UTF8_NO_LUA).
 *
 * For any bytes: the output is strictly valid UTF-8 (no overlong form, no surrogate, nothing
 * above U+10FFFF); the sizing call (out NULL) and the writing call agree on the length and the
 * verdict, and the length is within the documented bound (3 * n, csrc/core/core.h); valid input
 * comes back byte for byte with *valid set, and *valid is set exactly when the input is valid;
 * repairing the output changes nothing. The output also equals a reference written apart
 * (below), from the definition of U+FFFD substitution of maximal subparts (Unicode 3.9), which is
 * what Python's bytes.decode("utf-8", "replace") does.
 */
#include "fuzz.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t utf8_repair(const unsigned char *in, size_t n, unsigned char *out, int *valid);

/* Strict well-formedness, straight from Unicode Table 3-7. */
static int strict_valid(const unsigned char *s, size_t n)
{
	size_t i = 0;

	while (i < n) {
		unsigned char b = s[i];
		size_t len, k;
		unsigned char lo = 0x80, hi = 0xBF;

		if (b <= 0x7F) {
			i++;
			continue;
		}
		if (b >= 0xC2 && b <= 0xDF)
			len = 2;
		else if (b == 0xE0)
			len = 3, lo = 0xA0;
		else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF)
			len = 3;
		else if (b == 0xED)
			len = 3, hi = 0x9F;
		else if (b == 0xF0)
			len = 4, lo = 0x90;
		else if (b >= 0xF1 && b <= 0xF3)
			len = 4;
		else if (b == 0xF4)
			len = 4, hi = 0x8F;
		else
			return 0;
		if (n - i < len)
			return 0;
		if (s[i + 1] < lo || s[i + 1] > hi)
			return 0;
		for (k = 2; k < len; k++)
			if (s[i + k] < 0x80 || s[i + k] > 0xBF)
				return 0;
		i += len;
	}
	return 1;
}

/* The reference, by arithmetic rather than byte ranges. A lead byte announces a length L; the
 * bytes seen so far, completed with every possible continuation byte, cover a range of code
 * points; the prefix can still become a well-formed sequence when that range meets the code
 * points whose shortest form has L bytes, outside the surrogates. The longest such prefix is
 * the maximal subpart and becomes one U+FFFD; a lead byte no prefix survives is one U+FFFD. */
static int lead_len(unsigned char b)
{
	if (b < 0x80)
		return 1;
	if (b >= 0xC0 && b < 0xE0)
		return 2;
	if (b >= 0xE0 && b < 0xF0)
		return 3;
	if (b >= 0xF0 && b < 0xF8)
		return 4;
	return 0;               /* a continuation byte, or F8..FF */
}

static int prefix_ok(const unsigned char *s, int k, int len)
{
	static const uint32_t lead_mask[5] = { 0, 0x7F, 0x1F, 0x0F, 0x07 };
	static const uint32_t min_cp[5] = { 0, 0, 0x80, 0x800, 0x10000 };
	static const uint32_t max_cp[5] = { 0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF };
	uint32_t lo = s[0] & lead_mask[len], hi;
	int j;

	for (j = 1; j < k; j++)
		lo = (lo << 6) | (s[j] & 0x3F);
	hi = lo;
	for (; j < len; j++) {
		lo = lo << 6;
		hi = (hi << 6) | 0x3F;
	}
	if (lo < min_cp[len])
		lo = min_cp[len];
	if (hi > max_cp[len])
		hi = max_cp[len];
	if (lo > hi)
		return 0;
	return !(lo >= 0xD800 && hi <= 0xDFFF);
}

static size_t reference(const unsigned char *in, size_t n, unsigned char *out)
{
	size_t i = 0, o = 0;

	while (i < n) {
		int len = lead_len(in[i]), k = 1;

		if (len == 1) {
			out[o++] = in[i++];
			continue;
		}
		if (len > 1 && prefix_ok(in + i, 1, len)) {
			while (k < len && i + (size_t)k < n && (in[i + k] & 0xC0) == 0x80 &&
			       prefix_ok(in + i, k + 1, len))
				k++;
			if (k == len) {
				memcpy(out + o, in + i, (size_t)len);
				o += (size_t)len;
				i += (size_t)len;
				continue;
			}
		}
		out[o++] = 0xEF;
		out[o++] = 0xBF;
		out[o++] = 0xBD;
		i += (size_t)k;
	}
	return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int valid = -1, valid2 = -1, valid3 = -1;
	size_t m, m2, m3, mr;
	unsigned char *out, *again, *ref;

	m = utf8_repair(data, size, NULL, &valid);
	FUZZ_CHECK(valid == 0 || valid == 1, "valid = %d", valid);
	FUZZ_CHECK(m <= 3 * size, "%zu bytes out of %zu in", m, size);
	FUZZ_CHECK(utf8_repair(data, size, NULL, NULL) == m, "length depends on valid");

	/* exactly m bytes: a write past them is an AddressSanitizer report */
	out = malloc(m ? m : 1);
	if (!out)
		abort();
	m2 = utf8_repair(data, size, out, &valid2);
	FUZZ_CHECK(m2 == m && valid2 == valid, "sizing %zu/%d, writing %zu/%d", m, valid, m2, valid2);
	FUZZ_CHECK(strict_valid(out, m), "output is not valid UTF-8");
	FUZZ_CHECK(valid == strict_valid(data, size), "valid = %d for %s input", valid,
		   valid ? "invalid" : "valid");
	if (valid)
		FUZZ_CHECK(m == size && memcmp(out, data, size) == 0, "valid input changed");
	else
		FUZZ_CHECK(m >= 3, "invalid input without a U+FFFD");

	/* idempotent */
	again = malloc(m ? m : 1);
	if (!again)
		abort();
	m3 = utf8_repair(out, m, again, &valid3);
	FUZZ_CHECK(valid3 == 1 && m3 == m && memcmp(again, out, m) == 0, "repair is not idempotent");

	/* the reference */
	ref = malloc(3 * size + 1);
	if (!ref)
		abort();
	mr = reference(data, size, ref);
	FUZZ_CHECK(mr == m && memcmp(ref, out, m) == 0, "differs from the reference (%zu vs %zu bytes)",
		   m, mr);

	free(ref);
	free(again);
	free(out);
	return 0;
}
