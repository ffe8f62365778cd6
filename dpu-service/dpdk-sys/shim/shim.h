/*
 * dpdk-sys shim: exported forwards for DPDK functions that are static inline
 * in the headers (the data path), so Rust can call them. One line each, no
 * logic. Every function is named after the DPDK function it forwards, with
 * the prefix `dpdk_shim_`.
 */
#ifndef DPDK_SYS_SHIM_H
#define DPDK_SYS_SHIM_H

#include <stdint.h>
#include <rte_config.h>
#include <rte_mbuf.h>

uint16_t dpdk_shim_rte_eth_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **rx_pkts, uint16_t nb_pkts);
uint16_t dpdk_shim_rte_eth_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **tx_pkts, uint16_t nb_pkts);
struct rte_mbuf *dpdk_shim_rte_pktmbuf_alloc(struct rte_mempool *mp);
int dpdk_shim_rte_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int count);
void dpdk_shim_rte_pktmbuf_free(struct rte_mbuf *m);
char *dpdk_shim_rte_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
int dpdk_shim_rte_pktmbuf_trim(struct rte_mbuf *m, uint16_t len);
char *dpdk_shim_rte_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len);
char *dpdk_shim_rte_pktmbuf_adj(struct rte_mbuf *m, uint16_t len);
uint16_t dpdk_shim_rte_pktmbuf_headroom(const struct rte_mbuf *m);
/* rte_pktmbuf_copy of the whole packet into a buffer of the same pool. */
struct rte_mbuf *dpdk_shim_rte_pktmbuf_copy(const struct rte_mbuf *m);
void *dpdk_shim_rte_pktmbuf_mtod(struct rte_mbuf *m);
uint16_t dpdk_shim_rte_pktmbuf_data_len(const struct rte_mbuf *m);
uint32_t dpdk_shim_rte_pktmbuf_pkt_len(const struct rte_mbuf *m);
uint16_t dpdk_shim_rte_pktmbuf_nb_segs(const struct rte_mbuf *m);
uint16_t dpdk_shim_rte_pktmbuf_tailroom(const struct rte_mbuf *m);
uint16_t dpdk_shim_rte_mbuf_port(const struct rte_mbuf *m);
uint32_t dpdk_shim_rte_mbuf_rss_hash(const struct rte_mbuf *m);
unsigned int dpdk_shim_rte_lcore_id(void);
int dpdk_shim_rte_errno(void);
void dpdk_shim_rte_prefetch0(const volatile void *p);
/* RSS hash-function flags are macros built from RTE_BIT64(); export their values. */
uint64_t dpdk_shim_RTE_ETH_RSS_IP(void);
uint64_t dpdk_shim_RTE_ETH_RSS_TCP(void);
uint64_t dpdk_shim_RTE_ETH_RSS_UDP(void);

#endif
