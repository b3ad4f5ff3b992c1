// Expert cache policies on hand-made access sequences, pins, the budget split,
// --expert-budget parsing and the memory probe (MemAvailable, cgroup v1/v2
// limits) over fake files.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "experts/budget.h"
#include "experts/cache.h"
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
  experts_mem_paths paths = {p_mem, p_self, p_v1, p_v2};
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
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  assert_int_equal(system(cmd), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_policy_parse), cmocka_unit_test(test_lru),   cmocka_unit_test(test_lfu),
      cmocka_unit_test(test_lhu),          cmocka_unit_test(test_fld),   cmocka_unit_test(test_hobbit),
      cmocka_unit_test(test_pins),         cmocka_unit_test(test_split), cmocka_unit_test(test_shared_high_only),
      cmocka_unit_test(test_shared_mixed), cmocka_unit_test(test_shared_hobbit_high_uses), cmocka_unit_test(test_parse_budget),
      cmocka_unit_test(test_mem_probe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
