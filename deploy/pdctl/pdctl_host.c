/* pdctl_host: host names and addresses for the ops commands of pdctl. */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pdctl_host.h"

/* 1 when sa is loopback, wildcard, or an address of one of this machine's interfaces. */
static int pdctl_host__addr_is_local(const struct sockaddr *sa)
{
    struct ifaddrs *ifs, *it;
    int local = 0;

    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const void *)sa;
        uint32_t ip = ntohl(a->sin_addr.s_addr);
        if ((ip >> 24) == 127 || ip == 0)
            return 1;
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)sa;
        if (IN6_IS_ADDR_LOOPBACK(&a->sin6_addr) || IN6_IS_ADDR_UNSPECIFIED(&a->sin6_addr))
            return 1;
        if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr) && a->sin6_addr.s6_addr[12] == 127)
            return 1;
    } else
        return 0;

    if (getifaddrs(&ifs) != 0)
        return 0;
    for (it = ifs; it && !local; it = it->ifa_next) {
        if (!it->ifa_addr || it->ifa_addr->sa_family != sa->sa_family)
            continue;
        if (sa->sa_family == AF_INET)
            local = ((const struct sockaddr_in *)(const void *)it->ifa_addr)->sin_addr.s_addr ==
                    ((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr;
        else
            local = memcmp(&((const struct sockaddr_in6 *)(const void *)it->ifa_addr)->sin6_addr,
                           &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr,
                           sizeof(struct in6_addr)) == 0;
    }
    freeifaddrs(ifs);
    return local;
}

/* Resolves host (numeric only when numeric is set) and checks every address. */
static int pdctl_host__resolves_local(const char *host, int numeric)
{
    struct addrinfo hints = {0}, *res, *it;
    int local = 0;

    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = numeric ? AI_NUMERICHOST : 0;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return -1;
    for (it = res; it && !local; it = it->ai_next)
        local = pdctl_host__addr_is_local(it->ai_addr);
    freeaddrinfo(res);
    return local;
}

int pdctl_host_is_local(const char *host)
{
    char name[256];
    int r;

    if (!host || !*host || strcasecmp(host, "localhost") == 0)
        return 1;
    r = pdctl_host__resolves_local(host, 1);
    if (r >= 0)
        return r; /* a numeric address: decided without DNS */
    if (gethostname(name, sizeof name) == 0) {
        name[sizeof name - 1] = 0;
        size_t n = strcspn(name, ".");
        if (strcasecmp(host, name) == 0 || (strlen(host) == n && strncasecmp(host, name, n) == 0))
            return 1;
    }
    return pdctl_host__resolves_local(host, 0) == 1;
}

pd_status_t pdctl_host_parse_addr(const char *addr, char *host_p, size_t host_len, int *port_p)
{
    const char *colon, *hs = addr;
    size_t hn;
    char *end;
    long port;

    if (!addr)
        return PD_ERR_INVALID;
    if (addr[0] == '[') {
        const char *rb = strchr(addr, ']');
        if (!rb || rb[1] != ':')
            return PD_ERR_INVALID;
        hs = addr + 1;
        hn = (size_t)(rb - hs);
        colon = rb + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon || memchr(addr, ':', (size_t)(colon - addr)))
            return PD_ERR_INVALID; /* none, or an unbracketed v6 address */
        hn = (size_t)(colon - addr);
    }
    if (hn == 0 || hn >= host_len || !colon[1])
        return PD_ERR_INVALID;
    port = strtol(colon + 1, &end, 10);
    if (*end || port < 1 || port > 65535)
        return PD_ERR_INVALID;
    memcpy(host_p, hs, hn);
    host_p[hn] = 0;
    *port_p = (int)port;
    return PD_OK;
}

const char *pdctl_host_connect_name(const char *host)
{
    if (!host || !*host || strcmp(host, "0.0.0.0") == 0)
        return "127.0.0.1";
    if (strcmp(host, "::") == 0 || strcmp(host, "[::]") == 0)
        return "::1";
    return host;
}

void pdctl_host_format_addr(char *out, size_t len, const char *host, int port)
{
    snprintf(out, len, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}
