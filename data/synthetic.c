/*
synthetic.c: writes a toy robot dataset as a train_vla shard, for tests and for a first run
before real demonstrations exist (data/ grows Meta-World and LeRobot tools for those).

The toy task: a point agent moves to a target square. Each episode draws a task (which sets the
background colour and the instruction), a start and a target; the expert action is the clipped
velocity toward the target, so a policy must read the image (where the target is) and the state
(where the agent is) to act. Extra state/action dimensions carry smooth functions of the same
quantities, so any state_dim/action_dim works.

Cameras are --cams of --img x --img pixels, or one per --cam-size HxW (any height and width: for
the tests of the shard format; today's model trains only on square cameras of one size).

  make data/synthetic && ./data/synthetic -o data/default/synthetic_000.bin
  ./data/synthetic -o build/two_sizes.bin --cam-size 24x32 --cam-size 16x16
*/
#include "../vla/common.h"
#include "../vla/rng.h"
#include "../vla/shards.h"
#include "../vla/shard_writer.h"
#include "../vla/cli.h"

static const char* TASKS[] = {
    "move to the red square",
    "reach the green target",
    "go to blue",
    "touch the yellow square with the gripper, then stop",
};
static const uint8_t TASK_RGB[4][3] = {{200, 40, 40}, {40, 180, 60}, {50, 70, 210}, {220, 200, 40}};
#define N_TASKS 4

static void draw_square(uint8_t* im, int h, int w, float x, float y, int half, const uint8_t rgb[3]) {
    int cx = (int)((x * 0.5f + 0.5f) * (w - 1)), cy = (int)((y * 0.5f + 0.5f) * (h - 1));
    for (int r = cy - half; r <= cy + half; r++) {
        for (int col = cx - half; col <= cx + half; col++) {
            if (r < 0 || r >= h || col < 0 || col >= w) { continue; }
            memcpy(im + ((size_t)r * w + col) * 3, rgb, 3);
        }
    }
}

// "HxW" of --cam-size into height and width, 4 to 4096 each
static void parse_cam_size(const char* arg, uint32_t* h, uint32_t* w) {
    char tail;
    int ch, cw;
    if (sscanf(arg, "%dx%d%c", &ch, &cw, &tail) != 2 || ch < 4 || ch > 4096 || cw < 4 || cw > 4096) {
        vla_fail("--cam-size %s: expected HEIGHTxWIDTH, each from 4 to 4096 pixels, such as 24x32", arg);
    }
    *h = (uint32_t)ch;
    *w = (uint32_t)cw;
}

int main(int argc, char** argv) {
    const char* out = NULL;
    int n_cam = 2, img = 32, S = 4, A = 4, episodes = 64, min_len = 20, max_len = 40, n_tasks = N_TASKS;
    uint64_t seed = 1;
    int cams_given = 0;
    Cameras sized;  // the cameras of --cam-size, one per option
    memset(&sized, 0, sizeof(sized));
    static const struct option longs[] = {
        {"output", required_argument, 0, 'o'}, {"cams", required_argument, 0, 'c'},
        {"img", required_argument, 0, 'i'},    {"state", required_argument, 0, 's'},
        {"action", required_argument, 0, 'a'}, {"episodes", required_argument, 0, 'e'},
        {"min-len", required_argument, 0, 'm'}, {"max-len", required_argument, 0, 'M'},
        {"tasks", required_argument, 0, 't'},  {"seed", required_argument, 0, 'r'},
        {"cam-size", required_argument, 0, 'C'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":o:c:i:s:a:e:m:M:t:r:C:h", longs, NULL)) != -1) {
        switch (opt) {
            case 'o': out = optarg; break;
            case 'c': n_cam = (int)parse_int_arg("cams", optarg, 1, 16); cams_given = 1; break;
            case 'i': img = (int)parse_int_arg("img", optarg, 4, 4096); break;
            case 's': S = (int)parse_int_arg("state", optarg, 2, 4096); break;
            case 'a': A = (int)parse_int_arg("action", optarg, 2, 4096); break;
            case 'e': episodes = (int)parse_int_arg("episodes", optarg, 1, 1 << 24); break;
            case 'm': min_len = (int)parse_int_arg("min-len", optarg, 1, 1 << 20); break;
            case 'M': max_len = (int)parse_int_arg("max-len", optarg, 1, 1 << 20); break;
            case 't': n_tasks = (int)parse_int_arg("tasks", optarg, 1, N_TASKS); break;
            case 'r': seed = (uint64_t)parse_int_arg("seed", optarg, 0, 0x7fffffffffffffffL); break;
            case 'C':
                if (sized.n == VLA_MAX_CAM) { vla_fail("--cam-size given more than %d times: at most %d cameras", VLA_MAX_CAM, VLA_MAX_CAM); }
                parse_cam_size(optarg, &sized.height[sized.n], &sized.width[sized.n]);
                sized.n++;
                break;
            case 'h':
                printf("usage: %s -o FILE [--cams 2] [--img 32] [--state 4] [--action 4] [--episodes 64]\n"
                       "          [--min-len 20] [--max-len 40] [--tasks 4] [--seed 1]\n"
                       "          [--cam-size HxW ...]   one per camera, instead of --cams of --img x --img\n", argv[0]);
                return 0;
            case ':': vla_fail("option %s needs a value: see %s -h", argv[optind - 1], argv[0]);
            default: vla_fail("unknown option %s: see %s -h", argv[optind - 1], argv[0]);
        }
    }
    if (out == NULL) { vla_fail("no output file: pass -o FILE.bin"); }
    if (max_len < min_len) { vla_fail("--max-len %d is below --min-len %d", max_len, min_len); }
    if (sized.n > 0 && cams_given && n_cam != sized.n) {
        vla_fail("--cams %d but %d --cam-size: give one --cam-size per camera, or --cams and --img", n_cam, sized.n);
    }
    Cameras cams = sized.n > 0 ? sized : cameras_square(n_cam, img);
    n_cam = cams.n;
    Rng r;
    rng_init(&r, seed, 0);
    ShardEpisode* eps = (ShardEpisode*)mallocCheck((size_t)episodes * sizeof(ShardEpisode));
    uint64_t n_frames = 0;
    for (int e = 0; e < episodes; e++) {
        eps[e].first_frame = n_frames;
        eps[e].length = (uint32_t)(min_len + (int)(rng_u64(&r) % (uint64_t)(max_len - min_len + 1)));
        eps[e].task = (uint32_t)(rng_u64(&r) % (uint64_t)n_tasks);
        n_frames += eps[e].length;
    }
    size_t frame_bytes = cameras_frame_bytes(&cams);
    uint8_t* images = (uint8_t*)mallocCheck(n_frames * frame_bytes);
    float* state = (float*)mallocCheck(n_frames * S * sizeof(float));
    float* action = (float*)mallocCheck(n_frames * A * sizeof(float));
    const uint8_t agent_rgb[3] = {250, 250, 250};
    for (int e = 0; e < episodes; e++) {
        float x = (float)(2.0 * rng_uniform(&r) - 1.0) * 0.8f, y = (float)(2.0 * rng_uniform(&r) - 1.0) * 0.8f;
        float gx = (float)(2.0 * rng_uniform(&r) - 1.0) * 0.8f, gy = (float)(2.0 * rng_uniform(&r) - 1.0) * 0.8f;
        const uint8_t* rgb = TASK_RGB[eps[e].task];
        for (uint32_t k = 0; k < eps[e].length; k++) {
            uint64_t f = eps[e].first_frame + k;
            float vx = fmaxf(-1.0f, fminf(1.0f, 8.0f * (gx - x))), vy = fmaxf(-1.0f, fminf(1.0f, 8.0f * (gy - y)));
            for (int cam = 0; cam < n_cam; cam++) {
                int h = (int)cams.height[cam], w = (int)cams.width[cam], side = h < w ? h : w;
                int half = side / 16 > 0 ? side / 16 : 1;
                uint8_t* im = images + f * frame_bytes + camera_offset(&cams, cam);
                for (int p = 0; p < h * w; p++) {  // background tinted by the task
                    im[3 * p + 0] = (uint8_t)(rgb[0] / 4); im[3 * p + 1] = (uint8_t)(rgb[1] / 4); im[3 * p + 2] = (uint8_t)(rgb[2] / 4);
                }
                float sx = cam % 2 == 0 ? 1.0f : -1.0f;  // the second camera sees the scene mirrored
                draw_square(im, h, w, sx * gx, gy, half + 1, rgb);
                draw_square(im, h, w, sx * x, y, half, agent_rgb);
            }
            float* st = state + f * S;
            st[0] = x; st[1] = y;
            for (int d = 2; d < S; d++) { st[d] = sinf((float)d * x + (float)(d % 3) * y); }
            float* ac = action + f * A;
            ac[0] = vx; ac[1] = vy;
            for (int d = 2; d < A; d++) { ac[d] = d == 2 ? (float)eps[e].task / (float)n_tasks : 0.5f * (vx - vy); }
            x += 0.05f * vx;
            y += 0.05f * vy;
        }
    }
    float* stats = (float*)mallocCheck(2 * (size_t)(S + A) * sizeof(float));
    shard_compute_stats(n_frames, state, S, action, A, stats);
    shard_write(out, &cams, (uint32_t)S, (uint32_t)A, n_frames, images, state, action, (uint64_t)episodes, eps,
                (uint64_t)n_tasks, TASKS, stats);
    char sizes[256];
    printf("wrote %s: %llu frames, %d episodes, %d tasks, %d camera(s) of %s, state %d, action %d\n", out,
           (unsigned long long)n_frames, episodes, n_tasks, n_cam, cameras_describe(&cams, sizes, sizeof(sizes)), S, A);
    free(eps); free(images); free(state); free(action); free(stats);
    return 0;
}
