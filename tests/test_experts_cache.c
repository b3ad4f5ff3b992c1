// Expert cache policies on hand-made access sequences, pins, the budget split,
// --expert-budget parsing and the memory probe (MemAvailable, cgroup v1/v2
// limits) over fake files; Belady's offline optimum in the simulator against
// hand counts, exhaustive search and the other policies.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "experts/budget.h"
#include "experts/cache.h"
#include "experts/trace.h"
#include "testutil.h"

static experts_cache make(int64_t n_layer, int64_t n_expert, int64_t n_high, experts_policy pol) {
  experts_cache c;
  float w[4];
  assert_int_equal(experts_policy_parse(experts_policy_name(pol), NULL, &pol, w), MOLE_OK);
  assert_int_equal(experts_cache_init(&c, n_layer, n_expert, n_high, 0, pol, w), MOLE_OK);
  return c;
}

// One step of one token using experts es[] of `layer` in high precision:
// hits stay, misses take the victim. Returns the misses.
static int step(experts_cache *c, int64_t layer, const int64_t *es, int n) {
  experts_cache_begin_step(c, 1);
  int misses = 0;
  for (int i = 0; i < n; i++) experts_cache_touch(c, layer, es[i], 1, 1);
  for (int i = 0; i < n; i++) {
    int64_t s = experts_cache_find(c, 0, layer, es[i]);
    if (s < 0) {
      s = experts_cache_victim(c, 0, layer, false);
      assert_true(s >= 0);
      experts_cache_assign(c, 0, s, layer, es[i]);
      c->slots[0][s].state = EXPERTS_SLOT_READY;
      misses++;
    }
    c->slots[0][s].pinned = true;
  }
  for (int i = 0; i < n; i++) c->slots[0][experts_cache_find(c, 0, layer, es[i])].pinned = false;
  experts_cache_end_step(c);
  return misses;
}

static bool cached(const experts_cache *c, int64_t layer, int64_t e) { return experts_cache_find(c, 0, layer, e) >= 0; }

static void test_policy_parse(void **state) {
  (void)state;
  experts_policy p;
  float w[4];
  assert_int_equal(experts_policy_parse("lru", NULL, &p, w), MOLE_OK);
  assert_int_equal(p, EXPERTS_POLICY_LRU);
  assert_true(w[0] == 1 && w[1] == 0 && w[2] == 0 && w[3] == 0);
  assert_int_equal(experts_policy_parse("FLD", NULL, &p, w), MOLE_OK);
  assert_true(w[3] == 1);
  assert_int_equal(experts_policy_parse(NULL, NULL, &p, w), MOLE_OK);
  assert_int_equal(p, EXPERTS_POLICY_HOBBIT);
  assert_true(w[0] + w[1] + w[2] + w[3] > 0.999f);
  const float ok[4] = {0.25f, 0.25f, 0.25f, 0.25f}, bad_sum[4] = {0.5f, 0.5f, 0.5f, 0}, neg[4] = {-0.5f, 1, 0.5f, 0};
  assert_int_equal(experts_policy_parse("hobbit", ok, &p, w), MOLE_OK);
  assert_true(w[2] == 0.25f);
  assert_int_equal(experts_policy_parse("hobbit", bad_sum, &p, w), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "sum to 1.5"));
  assert_int_equal(experts_policy_parse("hobbit", neg, &p, w), MOLE_ERR_ARG);
  assert_int_equal(experts_policy_parse("lru", ok, &p, w), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "hobbit policy only"));
  assert_int_equal(experts_policy_parse("arc", NULL, &p, w), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "'arc'"));
}

static void test_lru(void **state) {
  (void)state;
  experts_cache c = make(1, 8, 3, EXPERTS_POLICY_LRU);
  const int64_t a[] = {0}, b[] = {1}, d[] = {2}, e[] = {3};
  assert_int_equal(step(&c, 0, a, 1) + step(&c, 0, b, 1) + step(&c, 0, d, 1), 3);
  assert_int_equal(step(&c, 0, a, 1), 0);  // 0 is now the most recent
  assert_int_equal(step(&c, 0, e, 1), 1);  // evicts 1, the least recent
  assert_false(cached(&c, 0, 1));
  assert_true(cached(&c, 0, 0) && cached(&c, 0, 2) && cached(&c, 0, 3));
  experts_cache_free(&c);
}

static void test_lfu(void **state) {
  (void)state;
  experts_cache c = make(1, 8, 3, EXPERTS_POLICY_LFU);
  const int64_t a[] = {0}, b[] = {1}, d[] = {2}, e[] = {3};
  step(&c, 0, a, 1);
  step(&c, 0, a, 1);
  step(&c, 0, a, 1);
  step(&c, 0, b, 1);
  step(&c, 0, b, 1);
  step(&c, 0, d, 1);  // frequencies 3, 2, 1
  step(&c, 0, e, 1);  // evicts 2, the least used, though 0 is the least recent
  assert_false(cached(&c, 0, 2));
  assert_true(cached(&c, 0, 0) && cached(&c, 0, 1) && cached(&c, 0, 3));
  experts_cache_free(&c);
}

static void test_lhu(void **state) {
  (void)state;
  experts_cache c = make(1, 8, 3, EXPERTS_POLICY_LHU);
  // expert 0: used twice, in low precision only; 1 once in high; 2 twice in high
  experts_cache_begin_step(&c, 1);
  experts_cache_touch(&c, 0, 0, 1, 0);
  experts_cache_touch(&c, 0, 1, 1, 1);
  experts_cache_touch(&c, 0, 2, 1, 1);
  experts_cache_end_step(&c);
  experts_cache_begin_step(&c, 1);
  experts_cache_touch(&c, 0, 0, 1, 0);
  experts_cache_touch(&c, 0, 2, 1, 1);
  experts_cache_end_step(&c);
  for (int64_t e = 0; e < 3; e++) {
    experts_cache_assign(&c, 0, e, 0, e);
    c.slots[0][e].state = EXPERTS_SLOT_READY;
  }
  experts_cache_begin_step(&c, 1);
  assert_int_equal(experts_cache_victim(&c, 0, 0, false), 0);  // fewest high-precision uses
  experts_cache_free(&c);
}

static void test_fld(void **state) {
  (void)state;
  // 4 layers, one cached expert in each; computing layer 2: layer 1 (just
  // used) is the farthest ahead, then 0, 3, and 2 itself is the nearest
  experts_cache c = make(4, 2, 4, EXPERTS_POLICY_FLD);
  for (int64_t l = 0; l < 4; l++) {
    experts_cache_assign(&c, 0, l, l, 0);
    c.slots[0][l].state = EXPERTS_SLOT_READY;
  }
  experts_cache_begin_step(&c, 1);
  assert_int_equal(experts_cache_victim(&c, 0, 2, false), 1);
  assert_true(experts_cache_priority(&c, 0, 1, 0, 2) < experts_cache_priority(&c, 0, 0, 0, 2));
  assert_true(experts_cache_priority(&c, 0, 0, 0, 2) < experts_cache_priority(&c, 0, 3, 0, 2));
  assert_true(experts_cache_priority(&c, 0, 3, 0, 2) < experts_cache_priority(&c, 0, 2, 0, 2));
  assert_true(experts_cache_priority(&c, 0, 2, 0, 2) == 1.0);
  // at layer 0, layer 3 is the farthest
  assert_int_equal(experts_cache_victim(&c, 0, 0, false), 3);
  experts_cache_free(&c);
}

static void test_hobbit(void **state) {
  (void)state;
  // weights (0.5, 0, 0, 0.5): a recently used expert of the layer just
  // computed loses to an older one of the next layer
  experts_cache c;
  const float w[4] = {0.5f, 0, 0, 0.5f};
  experts_policy pol;
  float wo[4];
  assert_int_equal(experts_policy_parse("hobbit", w, &pol, wo), MOLE_OK);
  assert_int_equal(experts_cache_init(&c, 4, 2, 2, 0, pol, wo), MOLE_OK);
  experts_cache_begin_step(&c, 1);
  experts_cache_touch(&c, 3, 0, 1, 1);  // layer 3 used at T = 1
  experts_cache_end_step(&c);
  experts_cache_begin_step(&c, 1);
  experts_cache_touch(&c, 1, 0, 1, 1);  // layer 1 used at T = 2
  experts_cache_end_step(&c);
  experts_cache_assign(&c, 0, 0, 3, 0);
  experts_cache_assign(&c, 0, 1, 1, 0);
  c.slots[0][0].state = c.slots[0][1].state = EXPERTS_SLOT_READY;
  experts_cache_begin_step(&c, 1);  // T = 3, computing layer 2
  // layer 3: 0.5*1/3 + 0.5*(1 - 1/4) = 0.5417; layer 1: 0.5*2/3 + 0.5*(1 - 3/4) = 0.4583
  assert_true(fabs(experts_cache_priority(&c, 0, 3, 0, 2) - (0.5 / 3 + 0.375)) < 1e-6);
  assert_int_equal(experts_cache_victim(&c, 0, 2, false), 1);
  // with LRU weights the older one goes
  experts_cache_free(&c);
  c = make(4, 2, 2, EXPERTS_POLICY_LRU);
  experts_cache_begin_step(&c, 1);
  experts_cache_touch(&c, 3, 0, 1, 1);
  experts_cache_end_step(&c);
  experts_cache_begin_step(&c, 1);
  experts_cache_touch(&c, 1, 0, 1, 1);
  experts_cache_end_step(&c);
  experts_cache_assign(&c, 0, 0, 3, 0);
  experts_cache_assign(&c, 0, 1, 1, 0);
  c.slots[0][0].state = c.slots[0][1].state = EXPERTS_SLOT_READY;
  experts_cache_begin_step(&c, 1);
  assert_int_equal(experts_cache_victim(&c, 0, 2, false), 0);
  // a new sequence forgets R, F, H
  experts_cache_reset_sequence(&c);
  assert_int_equal(c.t, 0);
  assert_int_equal(c.last_use[3 * 2 + 0], 0);
  assert_int_equal(c.uses[1 * 2 + 0], 0);
  experts_cache_free(&c);
}

static void test_pins(void **state) {
  (void)state;
  experts_cache c = make(1, 8, 3, EXPERTS_POLICY_LRU);
  for (int64_t e = 0; e < 3; e++) {
    experts_cache_begin_step(&c, 1);
    experts_cache_touch(&c, 0, e, 1, 1);
    experts_cache_assign(&c, 0, e, 0, e);
    c.slots[0][e].state = EXPERTS_SLOT_READY;
    experts_cache_end_step(&c);
  }
  experts_cache_begin_step(&c, 1);
  assert_int_equal(experts_cache_victim(&c, 0, 0, false), 0);
  c.slots[0][0].pinned = true;  // the least recent, but pinned
  assert_int_equal(experts_cache_victim(&c, 0, 0, false), 1);
  c.slots[0][1].state = EXPERTS_SLOT_LOADING;  // being read
  assert_int_equal(experts_cache_victim(&c, 0, 0, false), 2);
  experts_cache_set_soft(&c, 0, 2, true);  // prefetched: only when allowed
  assert_int_equal(experts_cache_victim(&c, 0, 0, false), -1);
  assert_int_equal(experts_cache_victim(&c, 0, 0, true), 2);
  assert_int_equal(c.n_soft[0], 1);
  c.slots[0][0].pinned = false;
  // soft-pinned goes after any unpinned one, whatever the priority
  assert_int_equal(experts_cache_victim(&c, 0, 0, true), 0);
  experts_cache_free(&c);
}

static void test_split(void **state) {
  (void)state;
  int64_t h, l;
  experts_cache_split(1000, 100, 50, false, &h, &l);
  assert_true(h == 10 && l == 0);
  // one budget for both precisions: each pool may take all of it
  experts_cache_split(1000, 100, 50, true, &h, &l);
  assert_true(h == 10 && l == 20);
}


// A copy of (layer, e) in pool p brought in at a new step: victim, assign, READY.
static int64_t load_at(experts_cache *c, int p, int64_t layer, int64_t e, int64_t n_high) {
  experts_cache_begin_step(c, 1);
  experts_cache_touch(c, layer, e, 1, n_high);
  const int64_t s = experts_cache_victim(c, p, layer, false);
  assert_true(s >= 0);
  experts_cache_assign(c, p, s, layer, e);
  c->slots[p][s].state = EXPERTS_SLOT_READY;
  experts_cache_end_step(c);
  return s;
}

static experts_cache make_shared(experts_policy pol) {
  // 400 bytes: 4 high slots of 100 or 8 low slots of 50 over the same bytes
  experts_cache c;
  float w[4];
  assert_int_equal(experts_policy_parse(experts_policy_name(pol), NULL, &pol, w), MOLE_OK);
  int64_t h, l;
  experts_cache_split(400, 100, 50, true, &h, &l);
  assert_true(h == 4 && l == 8);
  assert_int_equal(experts_cache_init(&c, 2, 8, h, l, pol, w), MOLE_OK);
  experts_cache_share(&c, 400, 100, 50);
  return c;
}

static void test_shared_high_only(void **state) {
  (void)state;
  // with no low copy requested the shared budget holds as many high copies
  // as a high-only one, and evicts the same way
  experts_cache c = make_shared(EXPERTS_POLICY_LRU), ref = make(2, 8, 4, EXPERTS_POLICY_LRU);
  for (int64_t i = 0; i < 20; i++) {
    const int64_t layer = i % 2, e = (i * 5) % 8;
    if (experts_cache_find(&c, 0, layer, e) >= 0) {
      assert_true(experts_cache_find(&ref, 0, layer, e) >= 0);
      continue;
    }
    assert_true(experts_cache_find(&ref, 0, layer, e) < 0);
    assert_int_equal(load_at(&c, 0, layer, e, 1), load_at(&ref, 0, layer, e, 1));
  }
  int64_t n = 0;
  for (int64_t s = 0; s < c.n_slots[0]; s++) n += c.slots[0][s].state == EXPERTS_SLOT_READY;
  assert_int_equal(n, 4);
  for (int64_t s = 0; s < 4; s++) assert_int_equal(experts_cache_offset(&c, 0, s), s * 100);
  experts_cache_free(&c);
  experts_cache_free(&ref);
}

static void test_shared_mixed(void **state) {
  (void)state;
  experts_cache c = make_shared(EXPERTS_POLICY_LRU);
  // four high copies fill the budget; expert 1 is the least recent
  const int64_t order[4] = {1, 0, 2, 3};
  for (int i = 0; i < 4; i++) assert_int_equal(load_at(&c, 0, 0, order[i], 1), i);
  // a low copy evicts the least recent high copy (slot 0, bytes [0, 100)):
  // low slots 7 and 6 lie there
  const int64_t l1 = load_at(&c, 1, 1, 5, 0);
  assert_true(l1 == 6 || l1 == 7);
  assert_true(experts_cache_find(&c, 0, 0, 1) < 0);
  for (int64_t e = 0; e < 4; e++) assert_true(e == 1 || experts_cache_find(&c, 0, 0, e) >= 0);
  assert_true(experts_cache_offset(&c, 1, l1) >= 0 && experts_cache_offset(&c, 1, l1) + 50 <= 100);
  // a second low copy takes the other half of those bytes: no eviction
  const int64_t l2 = load_at(&c, 1, 1, 6, 0);
  assert_true((l2 == 6 || l2 == 7) && l2 != l1);
  for (int64_t e = 0; e < 4; e++) assert_true(e == 1 || experts_cache_find(&c, 0, 0, e) >= 0);
  // a high copy: the least recent is now high expert 0 (slot 1), below both
  // low copies; pinned, it is kept and the next least recent (expert 2) goes
  c.slots[0][1].pinned = true;
  experts_cache_begin_step(&c, 1);
  assert_int_equal(experts_cache_victim(&c, 0, 0, false), 2);
  experts_cache_end_step(&c);
  c.slots[0][1].pinned = false;
  // unpinned, high expert 0 goes; the low copies (more recent) stay
  assert_int_equal(load_at(&c, 0, 1, 0, 1), 1);
  assert_true(experts_cache_find(&c, 1, 1, 5) >= 0 && experts_cache_find(&c, 1, 1, 6) >= 0);
  // later high copies evict by priority across precisions: the least recent
  // high ones first (slots 2 and 3), then the two low copies, less recent
  // than what is left, go together (high slot 0 holds both)
  assert_int_equal(load_at(&c, 0, 1, 1, 1), 2);
  assert_int_equal(load_at(&c, 0, 1, 2, 1), 3);
  assert_true(experts_cache_find(&c, 1, 1, 5) >= 0 && experts_cache_find(&c, 1, 1, 6) >= 0);
  assert_int_equal(load_at(&c, 0, 1, 3, 1), 0);
  assert_true(experts_cache_find(&c, 1, 1, 5) < 0 && experts_cache_find(&c, 1, 1, 6) < 0);
  for (int64_t e = 0; e < 4; e++) assert_true(experts_cache_find(&c, 0, 1, e) >= 0);
  // a low copy being read blocks the high slot over it
  const int64_t l3 = load_at(&c, 1, 1, 7, 0);
  int64_t hs = experts_cache_offset(&c, 1, l3) / 100;
  c.slots[1][l3].state = EXPERTS_SLOT_LOADING;
  experts_cache_begin_step(&c, 1);
  const int64_t v = experts_cache_victim(&c, 0, 0, false);
  assert_true(v >= 0 && v != hs);
  experts_cache_end_step(&c);
  c.slots[1][l3].state = EXPERTS_SLOT_READY;
  experts_cache_free(&c);
}

static void test_shared_hobbit_high_uses(void **state) {
  (void)state;
  // HOBBIT keeps counting high and low uses apart: of two copies alike but
  // for their high-precision uses, the one used in low precision goes first
  experts_cache c = make_shared(EXPERTS_POLICY_LHU);
  assert_int_equal(load_at(&c, 0, 0, 0, 1), 0);
  assert_int_equal(load_at(&c, 1, 0, 1, 0), 0);  // bytes [350, 400): over high slot 3
  assert_int_equal(load_at(&c, 0, 0, 2, 1), 1);
  assert_int_equal(load_at(&c, 0, 0, 3, 1), 2);
  experts_cache_begin_step(&c, 1);
  for (int64_t e = 0; e < 4; e++) experts_cache_touch(&c, 0, e, 1, e != 1);
  assert_int_equal(experts_cache_victim(&c, 0, 0, false), 3);
  experts_cache_assign(&c, 0, 3, 1, 0);
  c.slots[0][3].state = EXPERTS_SLOT_READY;
  assert_true(experts_cache_find(&c, 1, 0, 1) < 0);
  assert_int_equal(c.slots[1][0].state, EXPERTS_SLOT_EMPTY);
  experts_cache_end_step(&c);
  // with every high slot full, a low copy evicts the fewest high uses: the
  // newcomer (one use) under low slots 0 and 1
  const int64_t l = load_at(&c, 1, 0, 5, 0);
  assert_true(l == 0 || l == 1);
  assert_true(experts_cache_find(&c, 0, 1, 0) < 0);
  for (int64_t e = 0; e < 4; e++) assert_true(e == 1 || experts_cache_find(&c, 0, 0, e) >= 0);
  experts_cache_free(&c);
}

static void test_parse_budget(void **state) {
  (void)state;
  int64_t b;
  double f;
  assert_int_equal(experts_parse_budget("2GiB", &b, &f), MOLE_OK);
  assert_true(b == ((int64_t)2 << 30) && f == 0);
  assert_int_equal(experts_parse_budget("512MiB", &b, &f), MOLE_OK);
  assert_true(b == ((int64_t)512 << 20));
  assert_int_equal(experts_parse_budget("1.5G", &b, &f), MOLE_OK);
  assert_true(b == ((int64_t)3 << 29));
  assert_int_equal(experts_parse_budget("300MB", &b, &f), MOLE_OK);
  assert_true(b == 300000000);
  assert_int_equal(experts_parse_budget("4096", &b, &f), MOLE_OK);
  assert_true(b == 4096);
  assert_int_equal(experts_parse_budget("40%", &b, &f), MOLE_OK);
  assert_true(b == 0 && f > 0.3999 && f < 0.4001);
  assert_int_equal(experts_parse_budget("auto", &b, &f), MOLE_OK);
  assert_true(b == -1);
  assert_int_equal(experts_parse_budget("0", &b, &f), MOLE_OK);
  assert_true(b == 0 && f == 0);
  const char *bad[] = {"garbage", "", "-1GiB", "12XB", "150%", "0%", "1e30", "2 GiB"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (experts_parse_budget(bad[i], &b, &f) != MOLE_ERR_ARG) fail_msg("'%s' was accepted", bad[i]);
    if (*bad[i] && !strstr(mole_last_error(), bad[i])) fail_msg("message for '%s': %s", bad[i], mole_last_error());
  }
}

static char g_dir[256];

static void put(const char *rel, const char *text) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", g_dir, rel);
  // create parent directories
  for (char *s = p + strlen(g_dir) + 1; *s; s++)
    if (*s == '/') {
      *s = 0;
      mkdir(p, 0755);
      *s = '/';
    }
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void test_mem_probe(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/mole-test-cg-%d", (int)getpid());
  mkdir(g_dir, 0755);
  put("meminfo", "MemTotal:       16000000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n");
  put("self_cgroup", "12:cpu,cpuacct:/a\n4:memory:/box/job\n0::/\n");
  // v1: the parent's limit is the tightest; the job's own is larger
  put("v1/memory.limit_in_bytes", "9223372036854771712\n");
  put("v1/box/memory.limit_in_bytes", "1073741824\n");
  put("v1/box/memory.usage_in_bytes", "300000000\n");
  put("v1/box/memory.stat", "cache 1000\ntotal_inactive_file 100000000\n");
  put("v1/box/job/memory.limit_in_bytes", "2147483648\n");
  put("v2/memory.max", "max\n");
  char p_mem[300], p_self[300], p_v1[300], p_v2[300];
  snprintf(p_mem, sizeof p_mem, "%s/meminfo", g_dir);
  snprintf(p_self, sizeof p_self, "%s/self_cgroup", g_dir);
  snprintf(p_v1, sizeof p_v1, "%s/v1", g_dir);
  snprintf(p_v2, sizeof p_v2, "%s/v2", g_dir);
  experts_mem_paths paths = {p_mem, p_self, p_v1, p_v2, NULL};
  experts_mem_info mi;
  experts_mem_probe(&paths, &mi);
  assert_true(mi.mem_available == (int64_t)8000000 * 1024);
  assert_true(mi.cgroup_limit == 1073741824);
  assert_true(mi.cgroup_used == 200000000);
  assert_true(mi.available == 1073741824 - 200000000);
  assert_non_null(strstr(mi.source, "cgroup v1"));
  assert_non_null(strstr(mi.source, "/box"));
  // v2, tighter than v1
  put("self_cgroup", "4:memory:/box/job\n0::/svc\n");
  put("v2/svc/memory.max", "524288000\n");
  put("v2/svc/memory.current", "24288000\n");
  put("v2/svc/memory.stat", "anon 1\ninactive_file 0\n");
  experts_mem_probe(&paths, &mi);
  assert_true(mi.cgroup_limit == 524288000);
  assert_true(mi.available == 500000000);
  assert_non_null(strstr(mi.source, "cgroup v2"));
  // no limits: MemAvailable
  put("self_cgroup", "0::/\n");
  experts_mem_probe(&paths, &mi);
  assert_true(mi.cgroup_limit == -1);
  assert_true(mi.available == (int64_t)8000000 * 1024);
  // the real system: something sensible
  experts_mem_probe(NULL, &mi);
  assert_true(mi.available > 0);
  // CPU quota: v1 (cpu,cpuacct) walks up to the tightest, v2 when tighter
  char p_cpu[300];
  snprintf(p_cpu, sizeof p_cpu, "%s/cpu", g_dir);
  paths.cgroup_v1_cpu = p_cpu;
  put("self_cgroup", "12:cpu,cpuacct:/a/b\n4:memory:/box\n0::/svc\n");
  put("cpu/cpu.cfs_quota_us", "-1\n");
  put("cpu/cpu.cfs_period_us", "100000\n");
  put("cpu/a/cpu.cfs_quota_us", "50000\n");
  put("cpu/a/cpu.cfs_period_us", "100000\n");
  put("cpu/a/b/cpu.cfs_quota_us", "150000\n");
  put("cpu/a/b/cpu.cfs_period_us", "100000\n");
  put("v2/svc/cpu.max", "max 100000\n");
  assert_true(fabs(experts_cpu_quota(&paths) - 0.5) < 1e-9);
  put("v2/svc/cpu.max", "30000 100000\n");
  assert_true(fabs(experts_cpu_quota(&paths) - 0.3) < 1e-9);
  put("self_cgroup", "12:cpu,cpuacct:/\n0::/\n");
  assert_true(experts_cpu_quota(&paths) == 0);
  assert_true(experts_cpu_quota(NULL) >= 0);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  assert_int_equal(system(cmd), 0);
}

// ---- belady (mole cachesim) ------------------------------------------------------------
static char g_trace_path[256];

// A trace of one-token steps, one L record each: rec[i] lists its requests
// as expert*2 + (1 if low), layer lay[i] (NULL: 0), n[i] of them.
static void write_trace(int64_t n_layer, int64_t n_expert, int64_t n_used, int64_t slot_low, int n_rec, const int *lay,
                        const int *const *rec, const int *n, bool with_pred) {
  snprintf(g_trace_path, sizeof g_trace_path, "/tmp/mole-test-belady-%d.trace", (int)getpid());
  FILE *f = fopen(g_trace_path, "w");
  assert_non_null(f);
  fprintf(f, "mole-trace 1 layers %lld experts %lld used %lld slot_high 100 slot_low %lld low %d\n", (long long)n_layer,
          (long long)n_expert, (long long)n_used, (long long)slot_low, slot_low > 0);
  for (int i = 0; i < n_rec; i++) {
    const int l = lay ? lay[i] : 0;
    fprintf(f, "s %d 1\n", i);
    if (with_pred && i + 1 < n_rec && l + 1 < n_layer) fprintf(f, "P %d %d %d:h\n", l, l + 1, (i * 7) % (int)n_expert);
    fprintf(f, "L %d", l);
    for (int j = 0; j < n[i]; j++) fprintf(f, " %d:%c:1", rec[i][j] / 2, rec[i][j] % 2 ? 'l' : 'h');
    fprintf(f, " skip 0\n");
  }
  fclose(f);
}

static experts_sim_result sim_run(const char *policy, int64_t budget, bool prefetch) {
  experts_sim_params sp = {.budget = budget, .prefetch = prefetch};
  assert_int_equal(experts_policy_parse_offline(policy, NULL, &sp.policy, sp.weights), MOLE_OK);
  experts_sim_result r;
  if (experts_cachesim(g_trace_path, &sp, &r)) fail_msg("cachesim %s: %s", policy, mole_last_error());
  return r;
}

static int64_t hits_of(const experts_sim_result *r) { return r->c.hits[0] + r->c.hits[1]; }
static int64_t reqs_of(const experts_sim_result *r) { return hits_of(r) + r->c.misses[0] + r->c.misses[1]; }

static void test_belady_parse(void **state) {
  (void)state;
  experts_policy p;
  float w[4];
  // a running model cannot see its future
  assert_int_equal(experts_policy_parse("belady", NULL, &p, w), MOLE_ERR_ARG);
  assert_non_null(strstr(mole_last_error(), "cachesim"));
  assert_int_equal(experts_policy_parse_offline("belady", NULL, &p, w), MOLE_OK);
  assert_int_equal(p, EXPERTS_POLICY_BELADY);
  assert_true(w[0] == 0 && w[1] == 0 && w[2] == 0 && w[3] == 0);
  assert_int_equal(experts_policy_parse_offline("OPT", NULL, &p, w), MOLE_OK);
  assert_int_equal(p, EXPERTS_POLICY_BELADY);
  assert_string_equal(experts_policy_name(p), "belady");
  assert_int_equal(experts_policy_parse_offline("lru", NULL, &p, w), MOLE_OK);
  assert_int_equal(p, EXPERTS_POLICY_LRU);
}

static void test_belady_hand(void **state) {
  (void)state;
  // the textbook reference string with 3 frames: OPT faults 9 times (11
  // hits of 20), LRU 12 times (8 hits)
  enum { N = 20 };
  const int ref[N] = {7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1};
  int buf[N];
  const int *rec[N];
  int n[N];
  for (int i = 0; i < N; i++) {
    buf[i] = ref[i] * 2;
    rec[i] = &buf[i];
    n[i] = 1;
  }
  write_trace(1, 8, 1, 0, N, NULL, rec, n, false);
  experts_sim_result b = sim_run("belady", 300, false), l = sim_run("lru", 300, false);
  assert_int_equal(b.slots[0], 3);
  assert_int_equal(hits_of(&b), 11);
  assert_int_equal(b.c.misses[0], 9);
  assert_true(b.bound_exact && b.bound_hits == 11 && b.bound_requests == 20);
  assert_int_equal(hits_of(&l), 8);
  assert_int_equal(l.bound_requests, 0);  // no bound for the other policies

  // a layer's experts stay pinned while it runs: with 2 slots holding
  // {0, 2}, the record {0, 1} must evict 2 (0 is pinned though it is never
  // requested again), so 2 then misses: 1 hit (0) and 4 misses, where MIN
  // without pins would also hit 2
  const int r0[] = {0}, r1[] = {4}, r2[] = {0, 2}, r3[] = {4};
  const int *rec2[] = {r0, r1, r2, r3};
  const int n2[] = {1, 1, 2, 1};
  write_trace(1, 4, 2, 0, 4, NULL, rec2, n2, false);
  b = sim_run("belady", 200, false);
  assert_int_equal(hits_of(&b), 1);
  assert_int_equal(b.c.misses[0], 4);

  // two precisions sharing the budget: 200 bytes hold 2 high copies (100)
  // or 5 low ones (40), so at most 5 experts in any precision. Requests
  // (expert:precision) 0h 1l 2h 3l 4l 5h, 0l 1h, 0h 0l (one record: the repeat
  // counts once in the bound), 2l. The relaxed bound runs MIN with 5 slots
  // on 0 1 2 3 4 5 0 1 0 2: 5 misses fill it, 5 evicts 3 or 4 (never
  // again), then 0, 1, 0, 2 hit: 4 hits of 10
  const int m0[] = {0}, m1[] = {3}, m2[] = {4}, m3[] = {7}, m4[] = {9}, m5[] = {10}, m6[] = {1}, m7[] = {2}, m8[] = {0, 1},
            m9[] = {5};
  const int *rec3[] = {m0, m1, m2, m3, m4, m5, m6, m7, m8, m9};
  const int n3[] = {1, 1, 1, 1, 1, 1, 1, 1, 2, 1};
  write_trace(1, 8, 1, 40, 10, NULL, rec3, n3, false);
  b = sim_run("belady", 200, false);
  assert_true(b.slots[0] == 2 && b.slots[1] == 5);
  assert_false(b.bound_exact);
  assert_int_equal(b.bound_hits, 4);
  assert_int_equal(b.bound_requests, 10);
  assert_true(hits_of(&b) <= 4);
  for (int p = 0; p < EXPERTS_POLICY_BELADY; p++) {
    const experts_sim_result r = sim_run(experts_policy_name((experts_policy)p), 200, false);
    assert_true(hits_of(&r) <= b.bound_hits);
  }
  unlink(g_trace_path);
}

// The most hits any eviction choices get under the simulator's rules with
// one precision: a record's experts stay pinned until its wave is full (every
// slot pinned), then the wave is released.
static int64_t best_hits(const int *const *rec, const int *n, const int *lay, int n_expert, int n_rec, int i, int j,
                         uint32_t resident, uint32_t pinned, int slots) {
  if (i == n_rec) return 0;
  if (j == n[i]) return best_hits(rec, n, lay, n_expert, n_rec, i + 1, 0, resident, 0, slots);
  const uint32_t k = 1u << (lay[i] * n_expert + rec[i][j] / 2);
  if (resident & k) {
    if (pinned & k) return best_hits(rec, n, lay, n_expert, n_rec, i, j + 1, resident, pinned, slots);
    return 1 + best_hits(rec, n, lay, n_expert, n_rec, i, j + 1, resident, pinned | k, slots);
  }
  if (__builtin_popcount(resident) < slots)
    return best_hits(rec, n, lay, n_expert, n_rec, i, j + 1, resident | k, pinned | k, slots);
  if ((resident & ~pinned) == 0) pinned = 0;  // a new wave
  int64_t best = -1;
  for (uint32_t v = resident & ~pinned; v; v &= v - 1) {
    const uint32_t out = v & -v;
    const int64_t h = best_hits(rec, n, lay, n_expert, n_rec, i, j + 1, (resident & ~out) | k, pinned | k, slots);
    if (h > best) best = h;
  }
  return best;
}

static void test_belady_exhaustive(void **state) {
  (void)state;
  uint64_t rng = 0x5eed1234;
  enum { MAXR = 12 };
  for (int trial = 0; trial < 300; trial++) {
    const int n_layer = 1 + (int)(tu_rand_u64(&rng) % 2), n_expert = 4 / n_layer, slots = 2 + (int)(tu_rand_u64(&rng) % 2);
    int buf[MAXR][3], n[MAXR], lay[MAXR], n_rec = 0, total = 0;
    const int *rec[MAXR];
    while (total < 12) {
      // 1..3 distinct experts of one layer (3 with 2 slots: two waves)
      lay[n_rec] = (int)(tu_rand_u64(&rng) % (uint64_t)n_layer);
      int m = 1 + (int)(tu_rand_u64(&rng) % 3);
      m = MOLE_MIN(MOLE_MIN(m, n_expert), 12 - total);
      uint32_t used = 0;
      for (int j = 0; j < m; j++) {
        int e;
        do e = (int)(tu_rand_u64(&rng) % (uint64_t)n_expert);
        while (used & (1u << e));
        used |= 1u << e;
      }
      // in expert order, as the provider writes a record and computes a layer's groups
      for (int j = 0, e = 0; e < n_expert; e++)
        if (used & (1u << e)) buf[n_rec][j++] = e * 2;
      rec[n_rec] = buf[n_rec];
      n[n_rec++] = m;
      total += m;
    }
    write_trace(n_layer, n_expert, 1, 0, n_rec, lay, rec, n, false);
    const experts_sim_result b = sim_run("belady", slots * 100, false);
    const int64_t best = best_hits(rec, n, lay, n_expert, n_rec, 0, 0, 0, 0, slots);
    if (hits_of(&b) != best)
      fail_msg("trial %d: belady %lld hits, exhaustive search %lld (%d slots)", trial, (long long)hits_of(&b),
               (long long)best, slots);
    assert_int_equal(reqs_of(&b), 12);
  }
  unlink(g_trace_path);
}

static void test_belady_bounds_policies(void **state) {
  (void)state;
  uint64_t rng = 0xbe1adb;
  enum { LAYERS = 4, EXPERTS = 8, NREC = 600 };
  static int buf[NREC][5];
  const int *rec[NREC];
  int n[NREC], lay[NREC];
  for (int trial = 0; trial < 8; trial++) {
    const bool mixed = trial % 2;
    for (int i = 0; i < NREC; i++) {
      lay[i] = i % LAYERS;
      const int m = 1 + (int)(tu_rand_u64(&rng) % 5);  // prefill-like records of up to 5 experts
      uint32_t used = 0;
      for (int j = 0; j < m; j++) {
        int e;
        // skewed: low expert numbers are hot
        do e = (int)((tu_rand_u64(&rng) % EXPERTS) * (tu_rand_u64(&rng) % EXPERTS) / EXPERTS);
        while (used & (1u << e));
        used |= 1u << e;
        buf[i][j] = e * 2 + (mixed && tu_rand_u64(&rng) % 3 == 0);
      }
      rec[i] = buf[i];
      n[i] = m;
    }
    write_trace(LAYERS, EXPERTS, 2, mixed ? 40 : 0, NREC, lay, rec, n, true);
    for (int64_t budget = 300; budget <= 2400; budget += 300) {
      const experts_sim_result b = sim_run("belady", budget, false), bp = sim_run("belady", budget, true);
      // belady ignores prefetch
      assert_int_equal(hits_of(&bp), hits_of(&b));
      assert_int_equal(bp.c.prefetches, 0);
      assert_true(b.bound_exact == !mixed);
      assert_true(hits_of(&b) <= b.bound_hits);
      const double bound_rate = (double)b.bound_hits / (double)b.bound_requests;
      for (int p = 0; p < EXPERTS_POLICY_BELADY; p++) {
        const experts_sim_result r = sim_run(experts_policy_name((experts_policy)p), budget, false);
        if (hits_of(&r) > b.bound_hits || (double)hits_of(&r) / (double)reqs_of(&r) > bound_rate + 1e-12)
          fail_msg("%s trace, budget %lld: %s has %lld hits of %lld, the bound %lld of %lld", mixed ? "mixed" : "high",
                   (long long)budget, experts_policy_name((experts_policy)p), (long long)hits_of(&r),
                   (long long)reqs_of(&r), (long long)b.bound_hits, (long long)b.bound_requests);
        // with one precision the belady replay is the bound
        if (!mixed) assert_true(hits_of(&r) <= hits_of(&b));
      }
    }
  }
  unlink(g_trace_path);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_policy_parse), cmocka_unit_test(test_lru),   cmocka_unit_test(test_lfu),
      cmocka_unit_test(test_lhu),          cmocka_unit_test(test_fld),   cmocka_unit_test(test_hobbit),
      cmocka_unit_test(test_pins),         cmocka_unit_test(test_split), cmocka_unit_test(test_shared_high_only),
      cmocka_unit_test(test_shared_mixed), cmocka_unit_test(test_shared_hobbit_high_uses), cmocka_unit_test(test_parse_budget),
      cmocka_unit_test(test_mem_probe),    cmocka_unit_test(test_belady_parse), cmocka_unit_test(test_belady_hand),
      cmocka_unit_test(test_belady_exhaustive), cmocka_unit_test(test_belady_bounds_policies),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
