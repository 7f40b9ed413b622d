// SPDX-License-Identifier: MIT
/*
 * kcoll_gpu_doctor: what the GPU room found on this machine, as text for a
 * person or as one JSON object for a script. The first text line is the
 * verdict ("GPU: ...", "no GPU: <reason>" or "GPU not usable: <reason>").
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kcoll_gpu.h"

#ifndef KCOLL_VERSION
#define KCOLL_VERSION "unknown"
#endif

static const char *verdict(int rc)
{
	return rc == 0 ? "GPU" : rc == -ENODEV ? "no GPU" : "GPU not usable";
}

static const char *errno_name(int rc)
{
	switch (-rc) {
	case 0:
		return NULL;
	case ENODEV:
		return "ENODEV";
	case EOPNOTSUPP:
		return "EOPNOTSUPP";
	case ENOMEM:
		return "ENOMEM";
	default:
		return "EIO";
	}
}

static const char *yes_no(int v)
{
	return v == 1 ? "yes" : v == 0 ? "no" : "unknown";
}

/* ---- text ---------------------------------------------------------------- */

static void text_version(FILE *out, const char *label, int v)
{
	fprintf(out, "%-14s%d.%d (%d)", label, v / 1000, v % 1000 / 10, v);
}

static void text_report(FILE *out, const struct kcoll_gpu_info *in)
{
	if (in->rc == 0)
		fprintf(out, "GPU: %d of %d device%s usable, path %s\n", in->nusable, in->ndev,
			in->ndev == 1 ? "" : "s", kcoll_gpu_path_name(in->path));
	else
		fprintf(out, "%s: %s\nfix: %s\n", verdict(in->rc), in->why, in->fix);
	fprintf(out, "\n%-14s%s\n", "kcoll:", KCOLL_VERSION);

	if (!in->driver_loaded) {
		fprintf(out, "%-14snot loaded: %s\n", "driver:", in->driver_error);
	} else if (!in->driver_version) {
		fprintf(out, "%-14s%s loaded; %s\n", "driver:", in->driver_lib,
			in->driver_error[0] ? in->driver_error : "version unknown");
	} else {
		text_version(out, "driver:", in->driver_version);
		fprintf(out, " from %s\n", in->driver_lib);
	}
	if (in->kernels_loaded) {
		text_version(out, "CUDA runtime:", in->runtime_version);
		fprintf(out, " in %s\n%-14s%s (needs driver %d.%d+)\n", in->kernels_lib, "kernels:",
			in->archs, in->min_driver_version / 1000, in->min_driver_version % 1000 / 10);
	} else {
		fprintf(out, "%-14snot loaded: %s\n", "CUDA runtime:", in->kernels_error);
	}

	if (!in->ndev)
		fprintf(out, "%-14snone\n", "devices:");
	for (int i = 0; i < in->ndev && i < KCOLL_GPU_MAX_DEVICES; i++) {
		const struct kcoll_gpu_device *d = &in->dev[i];
		char label[32];

		snprintf(label, sizeof(label), "device %d:", d->index);
		fprintf(out, "%-14s%s, cc %d.%d, %d SMs, %.1f GiB, PCI %s\n", label, d->name,
			d->cc_major, d->cc_minor, d->sm_count, d->mem_bytes / 1073741824.0,
			d->pci_bus_id);
		fprintf(out, "%-14sdma-buf %s, GPUDirect RDMA %s, path %s\n", "", yes_no(d->dmabuf),
			yes_no(d->gdr), kcoll_gpu_path_name(d->path));
		if (!d->usable)
			fprintf(out, "%-14snot usable: %s\n", "", d->why);
	}
	if (in->ndev > KCOLL_GPU_MAX_DEVICES)
		fprintf(out, "%-14s(%d more not shown)\n", "", in->ndev - KCOLL_GPU_MAX_DEVICES);

	fprintf(out, "%-14snvidia_peermem %s, nv_peer_mem %s, ib_peer_mem %s\n", "peer memory:",
		yes_no(in->nvidia_peermem), yes_no(in->nv_peer_mem), yes_no(in->ib_peer_mem));
	fprintf(out, "%-14s%s\n", "RDMA devices:", in->nrdma ? in->rdma : "none");
	fprintf(out, "%-14sLinux %s (RDMA dma-buf MRs need 5.12+: %s)\n", "kernel:",
		in->kernel_release, yes_no(in->kernel_dmabuf));
	if (in->driver_loaded)
		fprintf(out, "%-14sCUDA IPC %s, dma-buf export %s\n", "device bufs:",
			yes_no(in->ipc), yes_no(in->dmabuf_export));
	else
		fprintf(out, "%-14sunsupported: no CUDA driver\n", "device bufs:");
	fprintf(out, "%-14s%s\n", "path:", kcoll_gpu_path_name(in->path));
	if (in->path_reason[0])
		fprintf(out, "%-14swhy: %s\n%-14sfix: %s\n", "", in->path_reason, "", in->path_fix);
}

/* ---- JSON ---------------------------------------------------------------- */

static void json_str(FILE *out, const char *s)
{
	if (!s) {
		fputs("null", out);
		return;
	}
	fputc('"', out);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(out, "\\%c", *p);
		else if (*p == '\n')
			fputs("\\n", out);
		else if (*p < 0x20)
			fprintf(out, "\\u%04x", *p);
		else
			fputc(*p, out);
	}
	fputc('"', out);
}

/* An empty string is "nothing to say": null. */
static void json_text(FILE *out, const char *s)
{
	json_str(out, s[0] ? s : NULL);
}

static void json_flag(FILE *out, int v)
{
	fputs(v == 1 ? "true" : v == 0 ? "false" : "null", out);
}

static void json_int(FILE *out, int v)
{
	if (v)
		fprintf(out, "%d", v);
	else
		fputs("null", out);
}

static void json_cuda(FILE *out, int v)
{
	if (!v) {
		fputs("null", out);
		return;
	}
	fprintf(out, "\"%d.%d\"", v / 1000, v % 1000 / 10);
}

static void json_names(FILE *out, const char *list)
{
	const char *sep = "";

	fputc('[', out);
	for (const char *p = list + strspn(list, " "); *p; p += strspn(p, " ")) {
		size_t n = strcspn(p, " ");
		char name[256];

		snprintf(name, sizeof(name), "%.*s", (int)n, p);
		fputs(sep, out);
		json_str(out, name);
		sep = ",";
		p += n;
	}
	fputc(']', out);
}

static void json_device(FILE *out, const struct kcoll_gpu_device *d)
{
	fprintf(out, "{\"index\":%d,\"name\":", d->index);
	json_str(out, d->name);
	fprintf(out, ",\"compute_capability\":\"%d.%d\",\"sm_count\":%d,\"memory_bytes\":%llu,"
		     "\"pci_bus_id\":",
		d->cc_major, d->cc_minor, d->sm_count, d->mem_bytes);
	json_str(out, d->pci_bus_id);
	fputs(",\"dma_buf\":", out);
	json_flag(out, d->dmabuf);
	fputs(",\"gpudirect_rdma\":", out);
	json_flag(out, d->gdr);
	fprintf(out, ",\"usable\":%s,\"why\":", d->usable ? "true" : "false");
	json_text(out, d->why);
	fputs(",\"path\":", out);
	json_str(out, kcoll_gpu_path_name(d->path));
	fputs(",\"path_reason\":", out);
	json_text(out, d->path_reason);
	fputs(",\"path_fix\":", out);
	json_text(out, d->path_fix);
	fputc('}', out);
}

static void json_report(FILE *out, const struct kcoll_gpu_info *in)
{
	fputs("{\"kcoll_version\":", out);
	json_str(out, KCOLL_VERSION);
	fprintf(out, ",\"usable\":%s,\"status\":", in->rc == 0 ? "true" : "false");
	json_str(out, verdict(in->rc));
	fprintf(out, ",\"errno\":%d,\"error\":", in->rc);
	json_str(out, errno_name(in->rc));
	fputs(",\"reason\":", out);
	json_text(out, in->why);
	fputs(",\"fix\":", out);
	json_text(out, in->fix);

	fputs(",\"driver\":{\"library\":", out);
	json_str(out, in->driver_lib);
	fprintf(out, ",\"loaded\":%s,\"error\":", in->driver_loaded ? "true" : "false");
	json_text(out, in->driver_error);
	fputs(",\"version\":", out);
	json_int(out, in->driver_version);
	fputs(",\"cuda\":", out);
	json_cuda(out, in->driver_version);

	fputs("},\"runtime\":{\"library\":", out);
	json_str(out, in->kernels_lib);
	fprintf(out, ",\"loaded\":%s,\"error\":", in->kernels_loaded ? "true" : "false");
	json_text(out, in->kernels_error);
	fputs(",\"version\":", out);
	json_int(out, in->runtime_version);
	fputs(",\"cuda\":", out);
	json_cuda(out, in->runtime_version);
	fputs(",\"min_driver_cuda\":", out);
	json_cuda(out, in->min_driver_version);
	fputs(",\"archs\":", out);
	json_names(out, in->archs);

	fprintf(out, "},\"device_count\":%d,\"usable_count\":%d,\"devices\":[", in->ndev,
		in->nusable);
	for (int i = 0; i < in->ndev && i < KCOLL_GPU_MAX_DEVICES; i++) {
		if (i)
			fputc(',', out);
		json_device(out, &in->dev[i]);
	}
	fputs("],\"peer_memory\":{\"nvidia_peermem\":", out);
	json_flag(out, in->nvidia_peermem);
	fputs(",\"nv_peer_mem\":", out);
	json_flag(out, in->nv_peer_mem);
	fputs(",\"ib_peer_mem\":", out);
	json_flag(out, in->ib_peer_mem);
	fputs("},\"rdma_devices\":", out);
	json_names(out, in->rdma);
	fputs(",\"kernel\":{\"release\":", out);
	json_str(out, in->kernel_release);
	fputs(",\"dmabuf_mr\":", out);
	json_flag(out, in->kernel_dmabuf);
	fputs("},\"device_buffers\":{\"ipc\":", out);
	json_flag(out, in->driver_loaded ? in->ipc : 0);
	fputs(",\"dmabuf_export\":", out);
	json_flag(out, in->driver_loaded ? in->dmabuf_export : 0);
	fputs("},\"path\":", out);
	json_str(out, kcoll_gpu_path_name(in->path));
	fputs(",\"path_reason\":", out);
	json_text(out, in->path_reason);
	fputs(",\"path_fix\":", out);
	json_text(out, in->path_fix);
	fputs("}\n", out);
}

static int report(FILE *out, int json, const struct kcoll_gpu_info *in)
{
	if (json)
		json_report(out, in);
	else
		text_report(out, in);
	if (fflush(out) || ferror(out))
		return -EIO;
	return in->rc;
}

int kcoll_gpu_doctor(FILE *out, int json)
{
	struct kcoll_gpu *g;

	if (kcoll_gpu_process(&g) == -ENOMEM)
		return -ENOMEM;
	return report(out, json, kcoll_gpu_info(g));
}

int kcoll_gpu_doctor_with(FILE *out, int json, const struct kcoll_gpu_config *cfg)
{
	struct kcoll_gpu *g;
	int rc;

	kcoll_gpu_open(&g, cfg);
	if (!g)
		return -ENOMEM;
	rc = report(out, json, kcoll_gpu_info(g));
	kcoll_gpu_close(g);
	return rc;
}
