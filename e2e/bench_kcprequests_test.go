package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// kcpRequests are the requests kcp served, by resource (with its
// subresource) and verb, read from kcp's apiserver_request_total: every
// client's, the provider's and the test's alike.
type kcpRequests map[string]float64

// writeVerbs are the verbs of apiserver_request_total that change an
// object.
var writeVerbs = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "APPLY": true, "DELETE": true, "DELETECOLLECTION": true}

// readKCPRequests scrapes kcp's /metrics as the shard's admin (the
// kubeconfig's shard-base context, else its current one).
func readKCPRequests(ctx context.Context, t *testing.T) kcpRequests {
	t.Helper()
	cfg := rest.CopyConfig(env.admin)
	if raw, err := clientcmd.LoadFromFile(env.kcp.Kubeconfig); err == nil {
		if c, err := clientcmd.NewNonInteractiveClientConfig(*raw, "shard-base", &clientcmd.ConfigOverrides{}, nil).ClientConfig(); err == nil {
			cfg = c
		}
	}
	cfg.Host = env.kcp.BaseURL
	if cfg.Host == "" {
		cfg.Host = env.admin.Host
	}
	if i := strings.Index(cfg.Host, "/clusters/"); i >= 0 {
		cfg.Host = cfg.Host[:i]
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(cfg.Host, "/")+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Logf("kcp /metrics: %v (kcp writes not counted)", err)
		return nil
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Logf("kcp /metrics: %s %v (kcp writes not counted)", resp.Status, err)
		return nil
	}
	out := kcpRequests{}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		labels := parseLabels(line[len("apiserver_request_total{"):strings.LastIndexByte(line, '}')])
		if labels["resource"] == "" {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		res := labels["resource"]
		if labels["subresource"] != "" {
			res += "/" + labels["subresource"]
		}
		out[res+" "+labels["verb"]] += v
	}
	return out
}

// parseLabels parses a Prometheus label set (a="x",b="y").
func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			break
		}
		name := s[:eq]
		rest := s[eq+2:]
		end := 0
		for end < len(rest) && rest[end] != '"' {
			if rest[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(rest) {
			break
		}
		out[name] = rest[:end]
		s = strings.TrimPrefix(rest[end+1:], ",")
	}
	return out
}

// authChecks are resources kcp writes to authorize a request (not an
// object any client changes).
var authChecks = map[string]bool{"subjectaccessreviews": true, "tokenreviews": true, "localsubjectaccessreviews": true, "selfsubjectaccessreviews": true}

// since is what clients wrote after before, by resource and verb, per n.
// kcp counts a write through an APIExport's virtual workspace twice (the
// client's APPLY or PATCH, then the GET and PUT or POST it makes of it):
// for a resource written with APPLY or PATCH only those (and DELETE) are
// counted, else POST, PUT and DELETE; kcp's own authorization checks are
// left out.
func (w kcpRequests) since(before kcpRequests, n int) (lines []string, total float64) {
	byRes := map[string]map[string]float64{}
	for k, v := range w {
		if d := v - before[k]; d > 0 {
			res, verb, _ := strings.Cut(k, " ")
			if authChecks[strings.Split(res, "/")[0]] {
				continue
			}
			if byRes[res] == nil {
				byRes[res] = map[string]float64{}
			}
			byRes[res][verb] = d
		}
	}
	for res, verbs := range byRes {
		counted := []string{"POST", "PUT", "DELETE", "DELETECOLLECTION"}
		if verbs["APPLY"] > 0 || verbs["PATCH"] > 0 {
			counted = []string{"APPLY", "PATCH", "DELETE", "DELETECOLLECTION"}
		}
		for _, verb := range counted {
			if d := verbs[verb]; d > 0 {
				lines = append(lines, fmt.Sprintf("%s %s %.2f", res, verb, d/float64(n)))
				total += d
			}
		}
	}
	sort.Strings(lines)
	return lines, total / float64(n)
}

// rest is what else kcp served after before, per n: reads (GET, LIST,
// WATCH) and the authorization checks it made itself (each one is
// admitted like a write).
func (w kcpRequests) rest(before kcpRequests, n int) (reads, checks float64) {
	for k, v := range w {
		res, verb, _ := strings.Cut(k, " ")
		switch d := v - before[k]; {
		case d <= 0:
		case authChecks[strings.Split(res, "/")[0]]:
			checks += d
		case !writeVerbs[verb]:
			reads += d
		}
	}
	return reads / float64(n), checks / float64(n)
}

// providerWrites are the provider's own requests to kcp that change
// something, by method (client-go's rest_client_requests_total).
func providerWrites(text string) map[string]float64 {
	out := map[string]float64{}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "rest_client_requests_total{") {
			continue
		}
		labels := parseLabels(line[len("rest_client_requests_total{"):strings.LastIndexByte(line, '}')])
		switch m := labels["method"]; m {
		case "POST", "PUT", "PATCH", "DELETE":
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			out[m] += v
		}
	}
	return out
}
