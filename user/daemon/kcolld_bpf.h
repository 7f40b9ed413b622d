/* SPDX-License-Identifier: MIT */
/* kcolld's use of the flow tracker (KCOLL_BPF=1): linked into kcolld only. */
#ifndef KCOLLD_BPF_H
#define KCOLLD_BPF_H

/* After kd_net_start: attach on the interfaces of the advertised addresses,
 * track the peer port, fill link ids. Never fails the daemon: it logs why
 * tracking is off, once, and returns. */
void kd_bpf_start(void);
/* At exit: detach what kd_bpf_start attached. */
void kd_bpf_stop(void);

#endif
