// experts/budget: how much RAM the expert cache may use. Parses
// --expert-budget values and measures what this process may still allocate:
// MemAvailable, and the memory limit of its cgroup (v1 or v2) when smaller.
#ifndef MOLE_EXPERTS_BUDGET_H
#define MOLE_EXPERTS_BUDGET_H

#include "base/base.h"

// An --expert-budget value: "2GiB", "512MiB", "1.5G", "300KB", "4096" (bytes;
// K/M/G/T and KiB.. are powers of 1024, KB/MB/GB/TB of 1000), "40%" (of
// what holding every expert takes: *frac = 0.4, *bytes = 0), "auto" (*bytes = -1)
// or "0" (every expert resident). The message of an error quotes the value.
mole_status experts_parse_budget(const char *s, int64_t *bytes, double *frac);

// Where the memory probe reads; NULL fields (or a NULL struct) use the system's.
// Tests point them at fake files.
typedef struct experts_mem_paths {
  const char *meminfo;      // "/proc/meminfo"
  const char *self_cgroup;  // "/proc/self/cgroup"
  const char *cgroup_v1;    // v1 memory controller mount: "/sys/fs/cgroup/memory"
  const char *cgroup_v2;    // v2 mount: "/sys/fs/cgroup" (or "/sys/fs/cgroup/unified")
  const char *cgroup_v1_cpu;  // v1 cpu controller mount: "/sys/fs/cgroup/cpu" (or cpu,cpuacct)
} experts_mem_paths;

typedef struct experts_mem_info {
  int64_t mem_available;  // MemAvailable in bytes; -1 when unknown
  int64_t cgroup_limit;   // the tightest cgroup memory limit on our path; -1 when none
  int64_t cgroup_used;    // that cgroup's usage minus its inactive file cache
  int64_t available;      // what we may still use: min(MemAvailable, limit - used); -1 unknown
  char source[320];       // which limit was tightest, for messages
} experts_mem_info;

// Fills *out; never fails (unknown values are -1).
void experts_mem_probe(const experts_mem_paths *paths, experts_mem_info *out);

// The CPU quota of this process's cgroup (v1 cfs quota / period, v2
// cpu.max), in cores, the tightest on its path: 0.35 for 35% of a core;
// 0 when there is none. Never fails.
double experts_cpu_quota(const experts_mem_paths *paths);

// "1.5 GiB", "512.0 MiB", "12 KiB", "100 B" into buf; returns buf.
const char *experts_fmt_bytes(char *buf, size_t n, double bytes);

#endif
