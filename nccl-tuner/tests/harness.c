/*
 * Loads a NCCL tuner plugin the way NCCL does and prints what it chose, one line per decision,
 * for the Rust tests (tests/support/harness.rs) to parse.
 *
 *   harness PLUGIN VERSION      PLUGIN as in NCCL_TUNER_PLUGIN ("ringside"), VERSION 2..7
 *
 * Loading, as NCCL's plugin_open.cc: dlopen(PLUGIN), else dlopen("libnccl-tuner-PLUGIN.so")
 * (found through LD_LIBRARY_PATH), RTLD_NOW | RTLD_LOCAL; then dlsym("ncclTunerPlugin_vN") and
 * init with that version's signature. Commands on stdin, one per line:
 *
 *   round   every collective x sizes 4 KiB..256 MiB: build a NCCL-like cost table, call
 *           getCollInfo (v2: NCCL's v2 adapter applied to its answer), pick the cheapest entry
 *           as NCCL does, call getChunkSize (v6+); prints one "pick" line each, then "end"
 *   sync    prints "synced" (lets the caller collect the log lines printed so far)
 *   quit    destroy/finalize, dlclose; prints "destroyed rc=N" and "bye"
 *
 * The logger handed to init prints "log level=L flags=F msg=..." lines.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ringside_nccl_tuner.h"

static const char* COLL_NAMES[] = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"};
static const char* ALGO_NAMES[] = {"tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"};
static const char* PROTO_NAMES[] = {"ll", "ll128", "simple"};
/* What the harness's "NCCL" would use as chunk size without a plugin. */
#define DEFAULT_CHUNK ((size_t)131072)

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  for (char* c = msg; *c; c++)
    if (*c == '\n') *c = ' ';
  (void)file;
  (void)line;
  printf("log level=%d flags=%lu msg=%s\n", (int)level, flags, msg);
}

/* A NCCL-like table: time = latency + bytes / bandwidth per algorithm and protocol. Tree (only
 * for allreduce, as in NCCL) wins small sizes with LL, ring wins large ones with Simple; PAT runs
 * allgather/reducescatter when the table has its row; collnet and NVLS are unavailable; tree
 * LL128 is unsupported. */
static void model_table(float* t, int numAlgo, int numProto, ncclFunc_t coll, double bytes) {
  for (int i = 0; i < numAlgo * numProto; i++) t[i] = (float)NCCL_ALGO_PROTO_IGNORE;
#define SET(a, p, lat, gbps) t[(a) * numProto + (p)] = (float)((lat) + bytes / ((gbps) * 1e3))
  if (coll == ncclFuncAllReduce) {
    SET(NCCL_ALGO_TREE, NCCL_PROTO_LL, 4.0, 2.0);
    SET(NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE, 20.0, 8.0);
  }
  SET(NCCL_ALGO_RING, NCCL_PROTO_LL, 9.0, 3.0);
  SET(NCCL_ALGO_RING, NCCL_PROTO_LL128, 12.0, 10.0);
  SET(NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 40.0, 20.0);
  if (numAlgo > NCCL_ALGO_PAT && (coll == ncclFuncAllGather || coll == ncclFuncReduceScatter))
    SET(NCCL_ALGO_PAT, NCCL_PROTO_SIMPLE, 6.0, 4.0);
#undef SET
}

/* NCCL's choice: the cheapest supported entry, first one on ties. */
static void cheapest(const float* t, int numAlgo, int numProto, int* algo, int* proto) {
  float best = -1.0f;
  *algo = NCCL_ALGO_UNDEF;
  *proto = NCCL_PROTO_UNDEF;
  for (int a = 0; a < numAlgo; a++)
    for (int p = 0; p < numProto; p++) {
      float c = t[a * numProto + p];
      if (c >= 0.0f && (best < 0.0f || c < best)) {
        best = c;
        *algo = a;
        *proto = p;
      }
    }
}

static const char* algo_name(int a) { return a >= 0 && a < NCCL_NUM_ALGORITHMS ? ALGO_NAMES[a] : "undef"; }
static const char* proto_name(int p) { return p >= 0 && p < NCCL_NUM_PROTOCOLS ? PROTO_NAMES[p] : "undef"; }

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s PLUGIN VERSION(2..7)\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* plugin = argv[1];
  int version = atoi(argv[2]);
  if (version < 2 || version > 7) {
    fprintf(stderr, "version %s: use 2 to 7\n", argv[2]);
    return 2;
  }

  void* lib = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
  char libname[256];
  snprintf(libname, sizeof libname, "libnccl-tuner-%s.so", plugin);
  if (!lib) lib = dlopen(libname, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "cannot load %s or %s: %s\n", plugin, libname, dlerror());
    return 3;
  }
  char sym[64];
  snprintf(sym, sizeof sym, "ncclTunerPlugin_v%d", version);
  void* table = dlsym(lib, sym);
  if (!table) {
    fprintf(stderr, "%s has no %s: %s\n", libname, sym, dlerror());
    return 3;
  }

  /* The name is the first field of every version. */
  printf("loaded symbol=%s name=%s\n", sym, *(const char* const*)table);

  void* ctx = NULL;
  ncclResult_t rc;
  ncclNvlDomainInfo_v5_t nvl = {1, 8, 8};
  static ncclTunerConstants_v5_t c5;
  static ncclTunerConstants_v7_t c7;
  switch (version) {
    case 2: rc = ((ncclTuner_v2_t*)table)->init(8, 2, logger, &ctx); break;
    case 3: rc = ((ncclTuner_v3_t*)table)->init(8, 2, logger, &ctx); break;
    case 4: rc = ((ncclTuner_v4_t*)table)->init(8, 2, logger, &ctx); break;
    case 5: rc = ((ncclTuner_v5_t*)table)->init(&ctx, 42, 8, 2, logger, &nvl, &c5); break;
    case 6: rc = ((ncclTuner_v6_t*)table)->init(&ctx, 42, 8, 2, logger, &nvl, &c5); break;
    default: rc = ((ncclTuner_v7_t*)table)->init(&ctx, 42, 8, 2, logger, &nvl, &c7); break;
  }
  printf("init rc=%d ctx=%s\n", (int)rc, ctx ? "set" : "null");
  if (rc != ncclSuccess) return 4;

  /* NCCL 2.22 (v3) had 6 algorithm rows; PAT arrived with the 7th. */
  int numAlgo = version == 3 ? 6 : NCCL_NUM_ALGORITHMS;
  int numProto = NCCL_NUM_PROTOCOLS;
  char cmd[64];
  while (fgets(cmd, sizeof cmd, stdin)) {
    if (strncmp(cmd, "sync", 4) == 0) {
      printf("synced\n");
    } else if (strncmp(cmd, "round", 5) == 0) {
      for (int coll = ncclFuncBroadcast; coll <= ncclFuncAllReduce; coll++) {
        for (size_t bytes = 4096; bytes <= ((size_t)256 << 20); bytes *= 4) {
          float t[NCCL_NUM_ALGORITHMS * NCCL_NUM_PROTOCOLS];
          model_table(t, numAlgo, numProto, (ncclFunc_t)coll, (double)bytes);
          int defAlgo, defProto;
          cheapest(t, numAlgo, numProto, &defAlgo, &defProto);
          int nChannels = 0; /* NCCL passes 0: "keep mine" unless the plugin sets it */
          if (version == 2) {
            int algo = NCCL_ALGO_UNDEF, proto = NCCL_PROTO_UNDEF;
            rc = ((ncclTuner_v2_t*)table)->getCollInfo(ctx, (ncclFunc_t)coll, bytes, 0, 0, 1, &algo, &proto, &nChannels);
            /* NCCL's v2 adapter: a supported pick costs 0 from now on. */
            if (algo >= 0 && algo < numAlgo && proto >= 0 && proto < numProto && t[algo * numProto + proto] != (float)NCCL_ALGO_PROTO_IGNORE)
              t[algo * numProto + proto] = 0.0f;
          } else if (version == 3) {
            rc = ((ncclTuner_v3_t*)table)->getCollInfo(ctx, (ncclFunc_t)coll, bytes, 1, (float**)t, numAlgo, numProto, &nChannels);
          } else {
            /* v4..v7 share the getCollInfo signature and its offset. */
            rc = ((ncclTuner_v4_t*)table)->getCollInfo(ctx, (ncclFunc_t)coll, bytes, 1, (float**)t, numAlgo, numProto, 0, &nChannels);
          }
          int algo, proto;
          cheapest(t, numAlgo, numProto, &algo, &proto);
          size_t chunk = DEFAULT_CHUNK;
          ncclResult_t crc = ncclSuccess;
          if (version >= 6) {
            ncclResult_t (*getChunkSize)(void*, ncclFunc_t, size_t, int, int, int, size_t*) =
                version == 6 ? ((ncclTuner_v6_t*)table)->getChunkSize : ((ncclTuner_v7_t*)table)->getChunkSize;
            if (getChunkSize) crc = getChunkSize(ctx, (ncclFunc_t)coll, bytes, algo, proto, nChannels, &chunk);
          }
          printf("pick v=%d coll=%s bytes=%zu default=%s/%s chosen=%s/%s channels=%d chunk=%zu rc=%d chunk_rc=%d\n",
                 version, COLL_NAMES[coll], bytes, algo_name(defAlgo), proto_name(defProto), algo_name(algo),
                 proto_name(proto), nChannels, chunk, (int)rc, (int)crc);
        }
      }
      printf("end\n");
    } else if (strncmp(cmd, "quit", 4) == 0) {
      break;
    }
  }
  rc = version <= 4 ? ((ncclTuner_v4_t*)table)->destroy(ctx)
                    : version == 5 ? ((ncclTuner_v5_t*)table)->finalize(ctx)
                    : version == 6 ? ((ncclTuner_v6_t*)table)->finalize(ctx)
                                   : ((ncclTuner_v7_t*)table)->finalize(ctx);
  printf("destroyed rc=%d\n", (int)rc);
  dlclose(lib);
  printf("bye\n");
  return rc == ncclSuccess ? 0 : 5;
}
