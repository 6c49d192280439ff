"""The proxy variables a command sees when its sandbox may reach out (SPEC §11)."""

from __future__ import annotations

from sandcell.network.bridge import HTTP_PORT
from sandcell.network.policy import NetworkPolicy

HTTP_PROXY_URL = f"http://127.0.0.1:{HTTP_PORT}"


def proxy_env(policy: NetworkPolicy) -> dict[str, str]:
    """Set when egress is not "none", so pip, npm, curl, git and requests use the proxies;
    the cell's own loopback stays direct. ALL_PROXY names the HTTP proxy too (its CONNECT
    reaches any allowed port): httpx, under the openai and anthropic SDKs, refuses to make a
    client at all when ALL_PROXY is a SOCKS URL and socksio is absent. The SOCKS5 proxy
    (SOCKS_PORT) is there for the tools pointed at it."""
    if policy.egress == "none":
        return {}
    return {
        "HTTP_PROXY": HTTP_PROXY_URL,
        "HTTPS_PROXY": HTTP_PROXY_URL,
        "http_proxy": HTTP_PROXY_URL,
        "https_proxy": HTTP_PROXY_URL,
        "ALL_PROXY": HTTP_PROXY_URL,
        "NO_PROXY": "localhost,127.0.0.1",
        "no_proxy": "localhost,127.0.0.1",
    }
