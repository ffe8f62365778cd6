/* One-line forwards; see shim.h. */
#include "shim.h"

#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_prefetch.h>

/* build.rs passes the release pkg-config reports: the headers must match. */
#if defined(DPDK_SYS_VER_YEAR) && (RTE_VER_YEAR != DPDK_SYS_VER_YEAR || RTE_VER_MONTH != DPDK_SYS_VER_MONTH)
#error "dpdk-sys: the DPDK headers found are not the release pkg-config reports"
#endif

uint16_t dpdk_shim_rte_eth_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **rx_pkts, uint16_t nb_pkts) { return rte_eth_rx_burst(port_id, queue_id, rx_pkts, nb_pkts); }
uint16_t dpdk_shim_rte_eth_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **tx_pkts, uint16_t nb_pkts) { return rte_eth_tx_burst(port_id, queue_id, tx_pkts, nb_pkts); }
struct rte_mbuf *dpdk_shim_rte_pktmbuf_alloc(struct rte_mempool *mp) { return rte_pktmbuf_alloc(mp); }
int dpdk_shim_rte_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int count) { return rte_pktmbuf_alloc_bulk(mp, mbufs, count); }
void dpdk_shim_rte_pktmbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }
char *dpdk_shim_rte_pktmbuf_append(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_append(m, len); }
int dpdk_shim_rte_pktmbuf_trim(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_trim(m, len); }
char *dpdk_shim_rte_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_prepend(m, len); }
char *dpdk_shim_rte_pktmbuf_adj(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_adj(m, len); }
uint16_t dpdk_shim_rte_pktmbuf_headroom(const struct rte_mbuf *m) { return rte_pktmbuf_headroom(m); }
struct rte_mbuf *dpdk_shim_rte_pktmbuf_copy(const struct rte_mbuf *m) { return rte_pktmbuf_copy(m, m->pool, 0, UINT32_MAX); }
void *dpdk_shim_rte_pktmbuf_mtod(struct rte_mbuf *m) { return rte_pktmbuf_mtod(m, void *); }
uint16_t dpdk_shim_rte_pktmbuf_data_len(const struct rte_mbuf *m) { return rte_pktmbuf_data_len(m); }
uint32_t dpdk_shim_rte_pktmbuf_pkt_len(const struct rte_mbuf *m) { return rte_pktmbuf_pkt_len(m); }
uint16_t dpdk_shim_rte_pktmbuf_nb_segs(const struct rte_mbuf *m) { return m->nb_segs; }
uint16_t dpdk_shim_rte_pktmbuf_tailroom(const struct rte_mbuf *m) { return rte_pktmbuf_tailroom(m); }
uint16_t dpdk_shim_rte_mbuf_port(const struct rte_mbuf *m) { return m->port; }
uint32_t dpdk_shim_rte_mbuf_rss_hash(const struct rte_mbuf *m) { return m->hash.rss; }
unsigned int dpdk_shim_rte_lcore_id(void) { return rte_lcore_id(); }
int dpdk_shim_rte_errno(void) { return rte_errno; }
void dpdk_shim_rte_prefetch0(const volatile void *p) { rte_prefetch0(p); }
uint64_t dpdk_shim_RTE_ETH_RSS_IP(void) { return RTE_ETH_RSS_IP; }
uint64_t dpdk_shim_RTE_ETH_RSS_TCP(void) { return RTE_ETH_RSS_TCP; }
uint64_t dpdk_shim_RTE_ETH_RSS_UDP(void) { return RTE_ETH_RSS_UDP; }
