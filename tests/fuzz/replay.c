/* replay: runs a libFuzzer target's LLVMFuzzerTestOneInput over corpus files without libFuzzer, so
 * the seed corpus (and every crash once fixed) replays as an ordinary test in any build.
 *
 * Usage: replay FILE_OR_DIR...  (directories are read one level deep, in name order). Exits 0 when
 * every input ran (the target aborts on a failed check), 1 when an argument cannot be read, no
 * input was found, or an input's verdict (fuzz_verdict.h) differs from the one its directory's
 * EXPECT file lists for it ("FILE VERDICT" lines; the hand-written seeds must all be listed, so a
 * corrupt input that is suddenly accepted fails the test; fz-* files found by the fuzzer need not).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_verdict.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *data = NULL;
    size_t n = 0, cap = 0, r;

    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    do {
        if (n == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *p = realloc(data, cap);
            if (!p) {
                fprintf(stderr, "replay: out of memory reading %s\n", path);
                free(data);
                fclose(f);
                return -1;
            }
            data = p;
        }
        r = fread(data + n, 1, cap - n, f);
        n += r;
    } while (r > 0);
    fclose(f);
    /* an exact-size copy, so ASan catches reads past the end as libFuzzer would */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) {
        free(data);
        return -1;
    }
    if (n)
        memcpy(exact, data, n);
    free(data);
    fuzz_verdict = NULL;
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

/* The verdict EXPECT (in dir) lists for name; NULL when none. *has_expect_p: EXPECT exists. */
static const char *replay__expected(const char *dir, const char *name, int *has_expect_p)
{
    static char want[64];
    char path[4096], line[512], file[400];
    FILE *f;

    snprintf(path, sizeof path, "%s/EXPECT", dir);
    *has_expect_p = 0;
    if (!(f = fopen(path, "r")))
        return NULL;
    *has_expect_p = 1;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || sscanf(line, "%399s %63s", file, want) != 2)
            continue;
        if (strcmp(file, name) == 0) {
            fclose(f);
            return want;
        }
    }
    fclose(f);
    return NULL;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int replay_dir(const char *dir, size_t *count)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;

    if (!d) {
        fprintf(stderr, "replay: cannot open directory %s\n", dir);
        return -1;
    }
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            char **p = realloc(names, cap * sizeof *p);
            if (!p) {
                rc = -1;
                break;
            }
            names = p;
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        if (!(names[n] = malloc(len))) {
            rc = -1;
            break;
        }
        snprintf(names[n++], len, "%s/%s", dir, e->d_name);
    }
    closedir(d);
    qsort(names, n, sizeof *names, name_cmp);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        const char *base = names[i] + strlen(dir) + 1;
        if (rc == 0 && strcmp(base, "EXPECT") != 0 && stat(names[i], &st) == 0 &&
            S_ISREG(st.st_mode)) {
            int has_expect;
            const char *want = replay__expected(dir, base, &has_expect);
            rc = replay_file(names[i]);
            (*count)++;
            if (rc == 0 && has_expect && !want && strncmp(base, "fz-", 3) != 0) {
                fprintf(stderr, "replay: %s: not listed in %s/EXPECT (verdict %s)\n", names[i], dir,
                        fuzz_verdict ? fuzz_verdict : "none");
                rc = -1;
            } else if (rc == 0 && want && (!fuzz_verdict || strcmp(want, fuzz_verdict) != 0)) {
                fprintf(stderr, "replay: %s: verdict %s, expected %s\n", names[i],
                        fuzz_verdict ? fuzz_verdict : "none", want);
                rc = -1;
            } else if (rc == 0 && fuzz_verdict) {
                printf("%s %s%s\n", base, fuzz_verdict, want ? " (as expected)" : "");
            }
        }
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    size_t count = 0;

    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: cannot stat %s\n", argv[i]);
            return 1;
        }
        if (S_ISDIR(st.st_mode) ? replay_dir(argv[i], &count) : (count++, replay_file(argv[i])))
            return 1;
    }
    printf("replay: %zu inputs ran\n", count);
    return count ? 0 : 1;
}
