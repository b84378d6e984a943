/* replay: runs a libFuzzer target (linked in) over the files and directories named on the command
 * line, so the seed corpora replay as ordinary tests in every build, without libFuzzer. Each input
 * is copied into a buffer of exactly its size so sanitizers catch reads past the end. Fails when
 * no input was found (a test must be able to fail). */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Runs the target on one file; returns 0 or -1 when it cannot be read. */
static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long size;

    if (!f || fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "replay: %s: cannot read: %s\n", path, strerror(errno));
        if (f)
            fclose(f);
        return -1;
    }
    buf = malloc(size ? (size_t)size : 1);
    if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "replay: %s: short read\n", path);
        free(buf);
        fclose(f);
        return -1;
    }
    fclose(f);
    fprintf(stderr, "replay: %s (%ld bytes)\n", path, size);
    LLVMFuzzerTestOneInput(buf, (size_t)size);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int n_inputs = 0;

    for (int i = 1; i < argc; i++) {
        struct stat sb;
        struct dirent **names;
        int n;

        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        if (!S_ISDIR(sb.st_mode)) {
            if (replay_file(argv[i]) != 0)
                return 1;
            n_inputs++;
            continue;
        }
        n = scandir(argv[i], &names, NULL, alphasort);
        if (n < 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        for (int k = 0; k < n; k++) {
            char path[4096];
            struct stat fs;
            snprintf(path, sizeof path, "%s/%s", argv[i], names[k]->d_name);
            if (names[k]->d_name[0] != '.' && stat(path, &fs) == 0 && S_ISREG(fs.st_mode)) {
                if (replay_file(path) != 0)
                    return 1;
                n_inputs++;
            }
            free(names[k]);
        }
        free(names);
    }
    if (n_inputs == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    fprintf(stderr, "replay: %d inputs ok\n", n_inputs);
    return 0;
}
