// The expert budget: size strings, MemAvailable and cgroup v1/v2 limits;
// also the cgroup CPU quota (dist's waits).
#include "experts/budget.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

mole_status experts_parse_budget(const char *s, int64_t *bytes, double *frac) {
  *bytes = 0;
  *frac = 0;
  if (!s || !*s) return mole_errorf(MOLE_ERR_ARG, "empty expert budget (examples: 2GiB, 512MiB, 40%%, auto)");
  if (!strcasecmp(s, "auto")) {
    *bytes = -1;
    return MOLE_OK;
  }
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || !(v >= 0) || isinf(v) || isspace((unsigned char)*s))
    return mole_errorf(MOLE_ERR_ARG, "'%s' is not a size (examples: 2GiB, 512MiB, 40%%, auto; 0 = all resident)", s);
  if (!strcmp(end, "%")) {
    if (!(v > 0 && v <= 100))
      return mole_errorf(MOLE_ERR_ARG, "'%s': a percentage must be in (0, 100]", s);
    *frac = v / 100.0;
    return MOLE_OK;
  }
  static const struct {
    const char *suffix;
    double mul;
  } k_units[] = {{"", 1},          {"b", 1},          {"k", 1024.0},   {"kib", 1024.0}, {"kb", 1e3},
                 {"m", 1048576.0}, {"mib", 1048576.0}, {"mb", 1e6},    {"g", 1073741824.0},
                 {"gib", 1073741824.0}, {"gb", 1e9},  {"t", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12}};
  for (size_t i = 0; i < sizeof k_units / sizeof k_units[0]; i++) {
    if (strcasecmp(end, k_units[i].suffix)) continue;
    double b = v * k_units[i].mul;
    if (b >= 9.0e18) return mole_errorf(MOLE_ERR_ARG, "'%s' is too large", s);
    *bytes = (int64_t)b;
    if (v > 0 && *bytes == 0) return mole_errorf(MOLE_ERR_ARG, "'%s' is less than one byte", s);
    return MOLE_OK;
  }
  return mole_errorf(MOLE_ERR_ARG, "'%s': unknown unit '%s' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB or %%)", s, end);
}

const char *experts_fmt_bytes(char *buf, size_t n, double b) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double a = fabs(b);
  while (a >= 1024.0 && u < 4) {
    a /= 1024.0;
    b /= 1024.0;
    u++;
  }
  if (u == 0) snprintf(buf, n, "%.0f B", b);
  else snprintf(buf, n, "%.1f %s", b, units[u]);
  return buf;
}

// ---- probing ---------------------------------------------------------------
// First integer of a file ("max" = -2), -1 when unreadable.
static int64_t read_i64_file(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[64] = {0};
  int64_t v = -1;
  if (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "max", 3)) {
      v = -2;
    } else {
      char *end;
      errno = 0;
      long long x = strtoll(line, &end, 10);
      if (!errno && end != line && x >= 0) v = x;
    }
  }
  fclose(f);
  return v;
}

// Value of "key N" in a stat-like file (memory.stat, /proc/meminfo with
// "Key: N kB"), scaled by `mul`; -1 when absent.
static int64_t read_keyed(const char *path, const char *key, int64_t mul) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[256];
  int64_t v = -1;
  const size_t kl = strlen(key);
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, kl) || (line[kl] != ' ' && line[kl] != ':' && line[kl] != '\t')) continue;
    const char *p = line + kl + (line[kl] == ':');
    long long x = strtoll(p, NULL, 10);
    if (x >= 0) v = x * mul;
    break;
  }
  fclose(f);
  return v;
}

// The cgroup path of this process for v1's controller `ctrl` (v2 = false)
// or the unified hierarchy (v2 = true), from /proc/self/cgroup.
static bool cgroup_path(const char *self, bool v2, const char *ctrl, char *out, size_t n) {
  FILE *f = fopen(self, "r");
  if (!f) return false;
  char line[1024];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    char *c1 = strchr(line, ':');
    char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2) continue;
    *c1 = *c2 = 0;
    const char *ctrls = c1 + 1, *path = c2 + 1;
    if (v2) {
      found = !strcmp(line, "0") && !*ctrls;
    } else {
      char buf[256];
      snprintf(buf, sizeof buf, "%s", ctrls);
      for (char *tok = strtok(buf, ","); tok && !found; tok = strtok(NULL, ",")) found = !strcmp(tok, ctrl);
    }
    if (found) snprintf(out, n, "%s", path);
  }
  fclose(f);
  return found;
}

// Walks from root/path up to root, keeping the tightest limit.
static void cgroup_walk(const char *root, const char *path, bool v2, experts_mem_info *out) {
  char dir[1024], file[1100];
  snprintf(dir, sizeof dir, "%s%s%s", root, path[0] == '/' ? "" : "/", path);
  size_t rl = strlen(root);
  for (;;) {
    size_t dl = strlen(dir);
    while (dl > rl && dir[dl - 1] == '/') dir[--dl] = 0;
    snprintf(file, sizeof file, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
    int64_t lim = read_i64_file(file);
    // v1 writes "no limit" as a huge page-rounded number
    if (lim >= 0 && lim < ((int64_t)1 << 60) && (out->cgroup_limit < 0 || lim < out->cgroup_limit)) {
      snprintf(file, sizeof file, "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes");
      int64_t used = read_i64_file(file);
      snprintf(file, sizeof file, "%s/memory.stat", dir);
      int64_t inactive = read_keyed(file, v2 ? "inactive_file" : "total_inactive_file", 1);
      if (inactive < 0) inactive = 0;
      used = used < 0 ? 0 : MOLE_MAX(used - inactive, 0);
      out->cgroup_limit = lim;
      out->cgroup_used = used;
      snprintf(out->source, sizeof out->source, "cgroup %s %.300s", v2 ? "v2" : "v1", dir);
    }
    if (dl <= rl) break;
    char *slash = strrchr(dir + rl, '/');
    if (!slash) break;
    *slash = 0;
    if (strlen(dir) < rl) break;
  }
}

void experts_mem_probe(const experts_mem_paths *paths, experts_mem_info *out) {
  experts_mem_paths p = paths ? *paths : (experts_mem_paths){0};
  if (!p.meminfo) p.meminfo = "/proc/meminfo";
  if (!p.self_cgroup) p.self_cgroup = "/proc/self/cgroup";
  if (!p.cgroup_v1) p.cgroup_v1 = "/sys/fs/cgroup/memory";
  if (!p.cgroup_v2) p.cgroup_v2 = access("/sys/fs/cgroup/cgroup.controllers", R_OK) == 0 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/unified";
  memset(out, 0, sizeof *out);
  out->mem_available = read_keyed(p.meminfo, "MemAvailable", 1024);
  out->cgroup_limit = -1;
  out->cgroup_used = 0;
  snprintf(out->source, sizeof out->source, "MemAvailable");
  char path[1024];
  if (cgroup_path(p.self_cgroup, false, "memory", path, sizeof path)) cgroup_walk(p.cgroup_v1, path, false, out);
  if (cgroup_path(p.self_cgroup, true, "", path, sizeof path)) cgroup_walk(p.cgroup_v2, path, true, out);
  out->available = out->mem_available;
  if (out->cgroup_limit >= 0) {
    int64_t cg = MOLE_MAX(out->cgroup_limit - out->cgroup_used, 0);
    if (out->available < 0 || cg < out->available) out->available = cg;
    else snprintf(out->source, sizeof out->source, "MemAvailable");
  }
}

// ---- CPU quota ---------------------------------------------------------------

// The tightest quota/period from dir up to root: v1's cpu.cfs_quota_us and
// cpu.cfs_period_us (quota -1 = none), v2's cpu.max ("max 100000" = none).
static double cpu_walk(const char *root, const char *path, bool v2) {
  char dir[1024], file[1100];
  snprintf(dir, sizeof dir, "%s%s%s", root, path[0] == '/' ? "" : "/", path);
  const size_t rl = strlen(root);
  double best = 0;
  for (;;) {
    size_t dl = strlen(dir);
    while (dl > rl && dir[dl - 1] == '/') dir[--dl] = 0;
    double q = -1, per = -1;
    if (v2) {
      snprintf(file, sizeof file, "%s/cpu.max", dir);
      FILE *f = fopen(file, "r");
      if (f) {
        long long a, b;
        if (fscanf(f, "%lld %lld", &a, &b) == 2) q = (double)a, per = (double)b;
        fclose(f);
      }
    } else {
      snprintf(file, sizeof file, "%s/cpu.cfs_quota_us", dir);
      FILE *f = fopen(file, "r");
      long long a;
      if (f && fscanf(f, "%lld", &a) == 1) q = (double)a;
      if (f) fclose(f);
      snprintf(file, sizeof file, "%s/cpu.cfs_period_us", dir);
      per = (double)read_i64_file(file);
    }
    if (q > 0 && per > 0 && (best == 0 || q / per < best)) best = q / per;
    if (dl <= rl) break;
    char *slash = strrchr(dir + rl, '/');
    if (!slash) break;
    *slash = 0;
  }
  return best;
}

double experts_cpu_quota(const experts_mem_paths *paths) {
  experts_mem_paths p = paths ? *paths : (experts_mem_paths){0};
  if (!p.self_cgroup) p.self_cgroup = "/proc/self/cgroup";
  if (!p.cgroup_v2) p.cgroup_v2 = access("/sys/fs/cgroup/cgroup.controllers", R_OK) == 0 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/unified";
  char path[1024];
  double best = 0;
  if (cgroup_path(p.self_cgroup, false, "cpu", path, sizeof path)) {
    // v1's cpu controller is mounted alone or together with cpuacct
    const char *roots[] = {p.cgroup_v1_cpu ? p.cgroup_v1_cpu : "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"};
    for (int i = 0; i < (p.cgroup_v1_cpu ? 1 : 2) && best == 0; i++) best = cpu_walk(roots[i], path, false);
  }
  if (cgroup_path(p.self_cgroup, true, "", path, sizeof path)) {
    double q = cpu_walk(p.cgroup_v2, path, true);
    if (q > 0 && (best == 0 || q < best)) best = q;
  }
  return best;
}
