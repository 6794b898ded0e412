#!/bin/bash
# gpu_check_stub.sh -- stands in for every binary of a GPU bundle (and for
# ldd and nvidia-smi) in tests/cli_gpu_check.sh, so deploy/gpu-check.sh can
# be driven through a passing GPU machine and through each way one fails,
# without a GPU. What it does depends on the name it is called by and on
# $GPU_FAKE, a space-separated list of faults (empty: all is well).
fault() { case " ${GPU_FAKE:-} " in *" $1 "*) return 0 ;; esac; return 1; }
arg() { # the value after flag $1 in the remaining arguments
    local f=$1; shift
    while [ $# -gt 0 ]; do [ "$1" = "$f" ] && { echo "$2"; return; }; shift; done
}
me=${0##*/}
case $me in
ldd)
    f=$1
    [ "${f#*/bin/}" = "$f" ] && exec /usr/bin/ldd "$@" # not a bundle binary: the real one
    printf '\tlinux-vdso.so.1 (0x00007ffd00000000)\n'
    printf '\tlibopenblas.so.0 => %s/../lib/libopenblas.so.0 (0x00007f0000000000)\n' "${f%/*}"
    printf '\tlibcublas.so.13 => /usr/local/cuda/lib64/libcublas.so.13 (0x00007f0000000000)\n'
    printf '\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0000000000)\n'
    fault missing_lib && printf '\tlibcudnn_fake.so.9 => not found\n'
    fault outside_lib && printf '\tlibzmq.so.5 => /usr/lib/x86_64-linux-gnu/libzmq.so.5 (0x00007f0000000000)\n'
    fault glibc_version && printf "%s: /lib/x86_64-linux-gnu/libc.so.6: version \`GLIBC_2.99' not found (required by %s)\n" "$f" "$f"
    printf '\t/lib64/ld-linux-x86-64.so.2 (0x00007f0000000000)\n'
    fault ldd_fails && { echo "	not a dynamic executable"; exit 1; }
    exit 0 ;;
nvidia-smi)
    echo "NVIDIA H200, 580.159.03, 143771 MiB, 9.0"; exit 0 ;;
gpu_probe)
    echo "cuda runtime: 13.0 (linked statically into the bundle)"
    echo "cuda driver api: 13.0"
    echo "cublas: 13.0.0"
    echo "cudnn: 9.13.0 (/usr/local/cuda/lib64/libcudnn.so.9)"
    if fault probe; then echo "probe: FAIL no NVIDIA driver (libcuda.so.1 not loadable)"; exit 1; fi
    if fault old_driver; then # passes only with the forward-compatibility libcuda first on the path
        case ":${LD_LIBRARY_PATH:-}:" in
        *":${CUDA_COMPAT_DIR:-/usr/local/cuda/compat}:"*) ;;
        *) echo "probe: FAIL cudaGetDeviceCount: CUDA driver version is insufficient for CUDA runtime version"; exit 1 ;;
        esac
    fi
    echo "gpu: NVIDIA H200, sm_90, 132 SMs, 139.8 GiB, L2 60 MiB, 1 device(s)"
    echo "reel backend: cuda:0, sm_90"
    exit 0 ;;
test_cuda)
    if [ "${CK_RUN_CASE:-}" = cudnn ]; then # the fused path's cuDNN case (step 7)
        echo "Running suite(s): cuda"
        fault cudnn_missing && echo "test_cuda: SKIP cudnn sdpa: built without cuDNN (no cudnn.h beside the toolkit)"
        if fault cudnn_fail; then
            echo "0%: Checks: 1, Failures: 1, Errors: 0"
            echo "tests/test_cuda.c:1420:F:cudnn:test_cudnn_sdpa_matches_the_cublas_decomposition_and_replays_bitwise:0: cudnn sdpa: plan failed"
            exit 1
        fi
        echo "100%: Checks: 1, Failures: 0, Errors: 0"
        exit 0
    fi
    fault suite_skip && { echo "test_cuda: SKIP: CUDA backend unavailable: no CUDA driver installed"; exit 0; }
    fault suite_hang && { sleep 300; exit 0; }
    fault suite_crash && { echo "Running suite(s): cuda"; exit 139; }
    echo "Running suite(s): cuda"
    if fault suite_fail; then
        echo "96%: Checks: 48, Failures: 2, Errors: 0"
        echo "tests/test_cuda.c:251:F:cuda_vs_cpu:test_gemm_with_and_without_bias_matches_cpu:1: gemm BF16: NMSE 0.3 > 1e-03"
        fault suite_exit0 && exit 0
        exit 1
    fi
    fault suite_few && { echo "100%: Checks: 3, Failures: 0, Errors: 0"; exit 0; }
    fault suite_rc && { echo "100%: Checks: 48, Failures: 0, Errors: 0"; exit 3; }
    fault suite_loud_skip && echo "test_wan_attention: SKIP: no GPU"
    echo "100%: Checks: 48, Failures: 0, Errors: 0"
    exit 0 ;;
test_vae_cuda)
    fault vae_skip && { echo "test_vae_cuda: SKIP: CUDA backend unavailable: no CUDA driver installed"; exit 0; }
    echo "Running suite(s): vae_cuda"
    if fault vae_fail; then
        echo "75%: Checks: 4, Failures: 1, Errors: 0"
        echo "tests/test_vae_cuda.c:160:F:vae_cuda:test_wan21_config_decodes_on_cuda_as_on_the_cpu:0: wan2.1: NMSE 0.2 > 1e-07"
        exit 1
    fi
    echo "100%: Checks: 4, Failures: 0, Errors: 0"
    exit 0 ;;
reelctl)
    sub=$1; shift
    case $sub in
    decode)
        out=$(arg -o "$@")
        fault decode_fail && { echo "reelctl: decode: out of device memory" >&2; exit 1; }
        echo stub >"$out"
        echo "reelctl: decoded latent [16,21,60,104] with VAE wan2.1 on cuda:0 to video [3,81,480,832] in 12.345 s (0.588 s per latent frame): $out" >&2
        exit 0 ;;
    kernels) echo "gemm cpu f32 cuda f32 bf16"; exit 0 ;;
    plan) echo "total: 1.2340e+09 FLOP, 5.6780e+07 bytes, 0.002 s"; exit 0 ;;
    weights|tensor)
        if [ "$sub" = tensor ] && [ "$1" = diff ]; then
            cmp -s "$2" "$3" && exit 0
            echo "tensor diff: latent differs at [0]"; exit 1
        fi
        echo stub >"$(arg --out "$@")"; exit 0 ;;
    run)
        b=$(arg --backend "$@"); dt=$(arg --dtype "$@"); g=$(arg --graphs "$@"); out=$(arg --out "$@")
        content="$b $dt"
        [ "$b" = cpu ] && content="cpu f32"
        if [ "$b" = cuda ] && fault run_fallback; then
            echo "reelctl: CUDA backend unavailable: no CUDA driver installed; using the CPU backend" >&2
            echo "reelctl: tiny on cpu (cpu-avx512): latent [4,2,8,8], 8 Euler steps with CFG, 0.1 s -> $out" >&2
            echo "cpu f32" >"$out"; exit 0
        fi
        [ "$b" = cuda ] && fault silent_fallback && content="cpu f32"
        [ "$b" = cuda ] && [ "$g" = off ] && fault graphs_differ && content="$content eager"
        echo "$content" >"$out"
        dev=cpu; arch=cpu-avx512
        [ "$b" = cuda ] && { dev=cuda:0; arch=sm_90; }
        echo "reelctl: tiny on $dev ($arch): latent [4,2,8,8], 8 Euler steps with CFG, 0.1 s -> $out" >&2
        if [ "$g" = on ]; then
            if fault no_replay; then echo "reelctl: graphs on: 0 captured, 0 replayed, 8 eager (warming_up 2, not_capturable 6)" >&2
            elif fault run_bad_decline; then echo "reelctl: graphs on: 1 captured, 4 replayed, 3 eager (warming_up 2, capture_failed 1)" >&2
            else echo "reelctl: graphs on: 1 captured, 5 replayed, 2 eager (warming_up 2)" >&2
            fi
        else
            echo "reelctl: graphs off: 0 captured, 0 replayed, 8 eager (override 8)" >&2
        fi
        exit 0 ;;
    gen)
        out=$(arg --out "$@")
        fault gen_fail && { echo "reelctl: gen: timeout: no RESULT within 45000 ms" >&2; exit 1; }
        l=$(arg --latent "$@"); echo "cuda ${l##*/}" >"$out"
        echo "reelctl: gen tiny via x: worker gpu0, weights v1, 6 steps (captured 1, replayed 4, eager 1: warming_up=1), 0.04 s on the worker -> $out" >&2
        exit 0 ;;
    stats)
        if fault bad_decline; then echo '{"overall":{"declines_by_reason":{"warming_up":2,"verify_mismatch":1}}}'
        else echo '{"overall":{"declines_by_reason":{"warming_up":2}}}'; fi
        exit 0 ;;
    esac
    echo "reelctl stub: unknown $sub" >&2; exit 2 ;;
reel-broker)
    [ "${1:-}" = --help ] && exit 0
    echo "reel-broker: ready clients=x workers=y"
    sleep 0.2
    echo "reel-broker: worker gpu0 ready (cuda:0, 2 streams)"
    while :; do sleep 0.2; done ;;
reel-worker)
    fault no_start && { echo "reel-worker: error while loading shared libraries: libzmq.so.5: cannot open shared object file"; exit 127; }
    [ "${1:-}" = --help ] && exit 0
    if fault worker_fallback; then
        echo "reel-worker gpu0: cuda unusable (CUDA backend unavailable: no driver); using the CPU backend"
        echo "reel-worker gpu0: ready (cpu, 2 streams)"
    elif fault worker_one_stream; then
        echo "reel-worker gpu0: ready (cuda:0, 1 streams)"
    else
        echo "reel-worker gpu0: ready (cuda:0, 2 streams)"
    fi
    audited=36; mism=0
    fault no_audits && audited=0
    fault audit_mismatch && mism=1
    trap 'echo "reel-worker gpu0: stopping; capture cache: 4 captures, 36 replays ($audited audited, $mism audit mismatches), 12 eager (0 in transient workspaces), 4 evictions (4 at shutdown)"; exit 0' TERM
    while :; do sleep 0.1; done ;;
gpu_compare)
    [ $# = 0 ] && exit 2
    got=$1 ref=$2; shift 2
    same=no; cmp -s "$got" "$ref" && same=yes
    head="compare latent [4,2,8,8]: nmse 3.1e-13 (tol 1e-05), max err 2e-06 = 1e-06 of max|ref| 2.1 (at 7), bitwise equal $same"
    if fault cmp_nmse; then echo "$head: FAIL nmse above tolerance"; exit 1; fi
    case " $* " in *" --differ "*) [ $same = yes ] && { echo "$head: FAIL bitwise equal to the reference"; exit 1; } ;; esac
    echo "$head: OK"; exit 0 ;;
gpu_attn_wan)
    [ "${1:-}" = --usage ] && exit 2
    if fault attn; then
        echo "attention bf16 cuda:0 q 32760 kv 32760 heads 12 d 128: 9.1 ms; 256 rows checked (reference 1.0 s): nmse 0.02 (tol 1e-04), max err 0.3 = 0.3 of max|ref| 1 (tol 0.0312, row 5): FAIL nmse above tolerance"
        exit 1
    fi
    dev=cuda:0; fault attn_cpu && dev=cpu
    echo "attention bf16 $dev q 32760 kv $(arg --kv "$@") heads 12 d 128: 9.100 ms; 256 rows checked (reference 1.0 s): nmse 1.2e-06 (tol 1e-04), max err 0.002 = 0.002 of max|ref| 1 (tol 0.0312, row 5): OK"
    exit 0 ;;
gpu_step_time)
    [ $# = 0 ] && exit 2
    c=$(arg --config "$@")
    fault step_replay && { echo "step $c bf16 cuda:0 sm_90: FAIL graph replay differs from the eager step in 12 of 512 latent values"; exit 1; }
    dev="cuda:0 sm_90"; fault step_cpu && dev="cpu cpu-avx512"
    a=$(arg --attention "$@"); out=$(arg --out "$@")
    path=sdpa; why="cuDNN's fused SDPA"
    if [ "$a" = decomposed ]; then path=decomposed; why=REEL_ATTN=decomposed
    elif fault no_sdpa; then path=decomposed; why="cuDNN could not be loaded (the fused attention is off)"; fi
    fault step_wan_fused && [ "$c" = wan2.1-1.3b ] && [ "$path" = sdpa ] &&
        { echo "step $c bf16 cuda:0 sm_90: FAIL attention_sdpa: cuDNN has no plan for nq=32760"; exit 1; }
    [ -n "$out" ] && echo "latent of $c on $path" >"$out"
    echo "step $c bf16 $dev: latent [16,2,8,8] tokens 32 text 5 layers 2 CFG, attention $path ($why): eager 1.234 ms, replay 0.321 ms, eager/replay 3.84x (median of 7 rounds x 40), 148 nodes, capture 2.1 ms, first step 40.0 ms, weights 0.1 s; replay == eager bitwise: OK"
    exit 0 ;;
bench_mix_step) # deploy/gpu-bench.sh's
    [ "${2:-}" = cuda ] || { echo "bench_mix_step: stub wants BUILD cuda, got '$*'" >&2; exit 2; }
    fault bench_fail && { echo "bench_mix_step: cuda: CUDA backend unavailable" >&2; exit 1; }
    echo "mix step tiny  cuda B=2: batched 0.300 ms, 124 nodes; singles 0.560 ms, 248 nodes; 1.87x"
    exit 0 ;;
bench_batching)
    [ "${6:-}" = cuda ] || { echo "bench_batching: stub wants BUILD REPS 16 8 all cuda, got '$*'" >&2; exit 2; }
    echo "tiny   off                1000.0    1.00x          2.0    1.00x  -"
    exit 0 ;;
esac
echo "gpu_check_stub: called as unknown '$me'" >&2
exit 2
