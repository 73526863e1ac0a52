# syntax=docker/dockerfile:1
# caliper-server image. The build stage installs Debian's packages with scripts/install-deps.sh
# and builds with scripts/build.sh: the same two scripts CI runs. The runtime stage holds only
# the shared libraries the server links (deploy/install-runtime.sh installs
# deploy/runtime-packages.txt) and runs as a non-root user.
#
#   docker build -t caliper-server:0.1.0-cuda .                          # CUDA backend (default)
#   docker build --build-arg VARIANT=cpu -t caliper-server:0.1.0-cpu .   # CPU only, no CUDA at all
#
# Both stages are Debian 12: the gRPC, Protobuf and Abseil the project builds against are
# bookworm's, and NVIDIA publishes no Debian CUDA images. So for VARIANT=cuda the toolkit is
# copied from NVIDIA's devel image into the build stage only (CUDA 13 supports Debian 12 and its
# gcc 12). The toolkit libraries the binary links (libcudart.so.13, found with ldd) are copied
# next to it, and the driver's libcuda comes from the NVIDIA container runtime when the pod gets
# a GPU. So the runtime base stays debian:bookworm-slim for both variants.

ARG VARIANT=cuda
ARG DEBIAN_IMAGE=debian:bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04

# --- CUDA toolkit, or nothing. Only the stage VARIANT names is built (BuildKit).
FROM ${CUDA_DEVEL_IMAGE} AS toolkit-cuda
RUN mkdir -p /opt/toolkit && cp -a "$(readlink -f /usr/local/cuda)" /opt/toolkit/cuda

FROM ${DEBIAN_IMAGE} AS toolkit-cpu
RUN mkdir -p /opt/toolkit

FROM toolkit-${VARIANT} AS toolkit

# --- build: CI's scripts, unchanged.
FROM ${DEBIAN_IMAGE} AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
# /usr/local/cuda/bin/nvcc is where the top-level CMakeLists.txt looks for CUDA.
COPY --from=toolkit /opt/toolkit/ /usr/local/
COPY . .
ARG JOBS=
RUN JOBS="${JOBS:-$(nproc)}" scripts/build.sh \
 && mkdir -p /opt/caliper/bin /opt/caliper/lib \
 && cp build/server/caliper-server /opt/caliper/bin/ \
 && { ldd build/server/caliper-server | awk '$3 ~ /^\/usr\/local\/cuda/ {print $3}' \
      | xargs -r cp -L -t /opt/caliper/lib; }

# --- runtime
FROM ${RUNTIME_IMAGE} AS runtime
COPY deploy/install-runtime.sh deploy/runtime-packages.txt /tmp/runtime/
RUN /tmp/runtime/install-runtime.sh && rm -rf /tmp/runtime
COPY --from=build /opt/caliper/ /opt/caliper/
ENV LD_LIBRARY_PATH=/opt/caliper/lib
# Compute only. NVIDIA_VISIBLE_DEVICES is deliberately unset: the device plugin sets it for pods
# that request nvidia.com/gpu, and "all" baked into an image would hand GPUs to pods that did not.
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
# Numeric, so Kubernetes' runAsNonRoot can verify it. Nothing is written outside /tmp, so the
# root filesystem can be mounted read-only.
USER 65532:65532
# gRPC (grpc.health.v1 for probes, reflection on) and Prometheus /metrics.
EXPOSE 50051 9464
# SIGTERM drains open streams for --drain_timeout seconds, then exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/caliper/bin/caliper-server"]
CMD ["--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464", "--device=auto"]
