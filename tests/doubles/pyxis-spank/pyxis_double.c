/*
 * pyxis_double: a TEST DOUBLE of the pyxis SPANK plugin, for shipyard's launcher tests. It is not pyxis and does
 * not containerize anything.
 *
 * It registers the pyxis options the launchers use (--container-image, --container-mounts, --container-workdir,
 * --container-name, --container-env, --no-container-mount-home), checks each value strictly, and exports what it
 * received to every task as SHIPYARD_PYXIS_DOUBLE_<OPTION> variables, so a test can assert what reached each node.
 * Anything unexpected (a relative or missing image file, a malformed or missing mount, a relative workdir, a bad
 * variable name) makes the option callback fail: srun then refuses the step with the message on stderr.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <slurm/spank.h>

SPANK_PLUGIN(pyxis_double, 1);

#define N_OPTS 6
static char *values[N_OPTS];
static const char *env_names[N_OPTS] = {
    "SHIPYARD_PYXIS_DOUBLE_CONTAINER_IMAGE",   "SHIPYARD_PYXIS_DOUBLE_CONTAINER_MOUNTS",
    "SHIPYARD_PYXIS_DOUBLE_CONTAINER_WORKDIR", "SHIPYARD_PYXIS_DOUBLE_CONTAINER_NAME",
    "SHIPYARD_PYXIS_DOUBLE_CONTAINER_ENV",     "SHIPYARD_PYXIS_DOUBLE_NO_CONTAINER_MOUNT_HOME",
};

static int fail(const char *opt, const char *val, const char *why)
{
    slurm_error("pyxis_double (test double): --%s=%s: %s", opt, val ? val : "", why);
    fprintf(stderr, "pyxis_double (test double): --%s=%s: %s\n", opt, val ? val : "", why);
    return -1;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int check_image(const char *v)
{
    if (v[0] == '/') {
        size_t n = strlen(v);
        if (n < 6 || strcmp(v + n - 5, ".sqsh") != 0)
            return fail("container-image", v, "a path image must be a .sqsh file");
        if (!exists(v))
            return fail("container-image", v, "image file does not exist");
        return 0;
    }
    /* [USER@][REGISTRY#]IMAGE[:TAG] */
    for (const char *p = v; *p; p++)
        if (isspace((unsigned char)*p))
            return fail("container-image", v, "whitespace in an image reference");
    return 0;
}

static int check_mounts(const char *v)
{
    char *copy = strdup(v), *save = NULL;
    int rc = 0;
    for (char *item = strtok_r(copy, ",", &save); item && !rc; item = strtok_r(NULL, ",", &save)) {
        char *src = item, *dst = strchr(item, ':'), *flags = NULL;
        if (!dst) { rc = fail("container-mounts", v, "each mount must be SRC:DST[:FLAGS]"); break; }
        *dst++ = '\0';
        flags = strchr(dst, ':');
        if (flags) {
            *flags++ = '\0';
            if (strcmp(flags, "ro") && strcmp(flags, "rw") && strncmp(flags, "ro+", 3) && strncmp(flags, "rw+", 3))
                rc = fail("container-mounts", v, "unknown mount flags");
        }
        if (!rc && (src[0] != '/' || dst[0] != '/'))
            rc = fail("container-mounts", v, "SRC and DST must be absolute");
        if (!rc && !exists(src))
            rc = fail("container-mounts", v, "a mount source does not exist");
    }
    free(copy);
    return rc;
}

static int check_env(const char *v)
{
    for (const char *p = v; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_' || *p == ','))
            return fail("container-env", v, "expected NAME,NAME,...");
    return 0;
}

static int cb(int val, const char *optarg, int remote)
{
    (void)remote;
    if (val < 0 || val >= N_OPTS)
        return -1;
    if (val == 5) {
        values[val] = strdup("1");
        return 0;
    }
    if (!optarg || !*optarg)
        return fail("container-*", optarg, "empty value");
    if (val == 0 && check_image(optarg))
        return -1;
    if (val == 1 && check_mounts(optarg))
        return -1;
    if (val == 2 && optarg[0] != '/')
        return fail("container-workdir", optarg, "must be an absolute path");
    if (val == 4 && check_env(optarg))
        return -1;
    free(values[val]);
    values[val] = strdup(optarg);
    return 0;
}

struct spank_option spank_options[] = {
    {"container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH", "test double of pyxis", 1, 0, cb},
    {"container-mounts", "SRC:DST[:FLAGS][,...]", "test double of pyxis", 1, 1, cb},
    {"container-workdir", "PATH", "test double of pyxis", 1, 2, cb},
    {"container-name", "NAME", "test double of pyxis", 1, 3, cb},
    {"container-env", "NAME[,NAME...]", "test double of pyxis", 1, 4, cb},
    {"no-container-mount-home", NULL, "test double of pyxis", 0, 5, cb},
    SPANK_OPTIONS_TABLE_END};

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    for (int i = 0; i < N_OPTS; i++)
        if (values[i] && spank_setenv(sp, env_names[i], values[i], 1) != ESPANK_SUCCESS)
            return -1;
    return 0;
}
