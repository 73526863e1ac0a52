# caliper-server image, two targets:
#
#   docker build --target cpu -t caliper-server:0.1.0-cpu .   # CPU backend only, no CUDA at all
#   docker build -t caliper-server:0.1.0-cuda .               # CUDA backend (the last target)
#
# The build stage installs Debian's packages with scripts/install-deps.sh and builds only
# caliper-server with scripts/build.sh (deploy/build-server.sh): the scripts CI runs. The runtime
# stage holds only the shared libraries the server links (deploy/install-runtime.sh installs
# deploy/runtime-packages.txt) and runs as a non-root user.
#
# The cpu stages come first and never name the CUDA image, so the legacy builder (which builds
# every stage up to --target) does not pull it for `--target cpu`; BuildKit and buildah build
# only the stages a target needs. Both stages are Debian 12: the gRPC, Protobuf and Abseil the
# project builds against are bookworm's, and NVIDIA publishes no Debian CUDA images, so the CUDA
# toolkit is copied from NVIDIA's devel image into the cuda build stage only (CUDA 13 supports
# Debian 12 and its gcc 12). The toolkit libraries the binary links (libcudart) go next to it;
# the driver's libcuda comes from the NVIDIA container runtime when the pod gets a GPU.

ARG DEBIAN_IMAGE=debian:bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04

# --- build dependencies (a layer of its own: it changes only with install-deps.sh)
FROM ${DEBIAN_IMAGE} AS deps
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && apt-get clean && rm -rf /var/lib/apt/lists/*

# --- runtime base, shared by both targets
FROM ${RUNTIME_IMAGE} AS runtime-base
COPY deploy/install-runtime.sh deploy/runtime-packages.txt /tmp/runtime/
RUN /tmp/runtime/install-runtime.sh && rm -rf /tmp/runtime
ENV LD_LIBRARY_PATH=/opt/caliper/lib
# Compute only. NVIDIA_VISIBLE_DEVICES is deliberately unset: the device plugin sets it for pods
# that request nvidia.com/gpu, and "all" baked into an image would hand GPUs to pods that did not.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
# Numeric, so Kubernetes' runAsNonRoot can verify it. Nothing is written outside /tmp and the
# state dir, so the root filesystem can be mounted read-only.
USER 65532:65532
# gRPC (grpc.health.v1 for probes, reflection on) and Prometheus /metrics.
EXPOSE 50051 9464
# SIGTERM drains open streams for --drain_timeout seconds, then exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/caliper/bin/caliper-server"]
CMD ["--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464", "--device=auto"]

# --- cpu
FROM deps AS build-cpu
COPY . .
ARG JOBS=
RUN JOBS="${JOBS:-$(nproc)}" deploy/build-server.sh /opt/caliper

FROM runtime-base AS cpu
COPY --from=build-cpu /opt/caliper/ /opt/caliper/

# --- cuda (default target). /usr/local/cuda/bin/nvcc is where CMakeLists.txt looks for CUDA.
FROM ${CUDA_DEVEL_IMAGE} AS toolkit-cuda
RUN cp -a "$(readlink -f /usr/local/cuda)" /opt/cuda

FROM deps AS build-cuda
COPY --from=toolkit-cuda /opt/cuda/ /usr/local/cuda/
COPY . .
ARG JOBS=
RUN JOBS="${JOBS:-$(nproc)}" deploy/build-server.sh /opt/caliper

FROM runtime-base AS cuda
COPY --from=build-cuda /opt/caliper/ /opt/caliper/
