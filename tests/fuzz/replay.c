/* replay: runs a libFuzzer target's LLVMFuzzerTestOneInput over corpus files without libFuzzer, so
 * the seed corpus (and every crash once fixed) replays as an ordinary test in any build.
 *
 * Usage: replay FILE_OR_DIR...  (directories are read one level deep, in name order). Exits 0 when
 * every input ran (the target aborts on a failed check), 1 when an argument cannot be read or no
 * input was found.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
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
        if (rc == 0 && stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
            rc = replay_file(names[i]);
            (*count)++;
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
