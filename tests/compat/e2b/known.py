"""What the version matrix and the framework tests know not to work here, and why: the reasons
of their xfail(strict=True) marks, so a change that makes one work shows as an unexpected pass,
naming the mark to remove (and docs/e2b.md's row to update)."""

# e2b-code-interpreter <= 2.6 reaches its interpreter at https://49999-{id}.{domain} whatever
# E2B_SANDBOX_URL says. test_matrix gives it sandcell's per-sandbox hosts through a TLS front
# and the SDK's proxy=; a framework that passes no proxy= needs real wildcard DNS.
WILDCARD_DNS = (
    "e2b-code-interpreter <= 2.6 sends run_code to https://49999-<id>.<domain>, which needs "
    "server.preview_domain and wildcard DNS to sandcell; the framework offers no proxy= option"
)
