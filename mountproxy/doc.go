// Package mountproxy is the shim between kcp and tenant apiservers (rule
// R16): kcp-front-proxy forwards a mounted workspace's requests to it with
// its proxy client certificate and the caller's identity in X-Remote-*
// headers; the shim authenticates that certificate (requestheader CA and
// allowed names) before it trusts the headers, strips every credential and
// identity header the caller sent, and forwards to the tenant over TLS
// verified against that tenant's CA only, authenticating with the tenant's
// credential and impersonating the caller.
//
// Requests name the tenant by path, /<prefix>/<logical cluster>/<name>/...,
// which carries no secret; a tenant is looked up in the Registry under the
// logical cluster it was registered for, so a path for one workspace never
// reaches another workspace's tenant.
package mountproxy
