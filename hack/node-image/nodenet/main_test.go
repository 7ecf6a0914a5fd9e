package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestConfRoutesEveryFamilyThroughPTP: one host-local range and one default
// route per podCIDR, ptp with masquerade, portmap for hostPort.
func TestConfRoutesEveryFamilyThroughPTP(t *testing.T) {
	b, err := conf([]string{"10.244.0.0/24", "fd00:10:244::/64"}, 1450)
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Plugins []struct {
			Type   string `json:"type"`
			IPMasq bool   `json:"ipMasq"`
			MTU    int    `json:"mtu"`
			IPAM   struct {
				Type   string                `json:"type"`
				Ranges [][]map[string]string `json:"ranges"`
				Routes []map[string]string   `json:"routes"`
			} `json:"ipam"`
			Capabilities map[string]bool `json:"capabilities"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Plugins) != 2 || c.Plugins[0].Type != "ptp" || c.Plugins[1].Type != "portmap" {
		t.Fatalf("plugins: %s", b)
	}
	p := c.Plugins[0]
	if !p.IPMasq || p.MTU != 1450 || p.IPAM.Type != "host-local" {
		t.Errorf("ptp: %s", b)
	}
	if len(p.IPAM.Ranges) != 2 || p.IPAM.Ranges[0][0]["subnet"] != "10.244.0.0/24" || p.IPAM.Ranges[1][0]["subnet"] != "fd00:10:244::/64" {
		t.Errorf("ranges: %v", p.IPAM.Ranges)
	}
	if len(p.IPAM.Routes) != 2 || p.IPAM.Routes[0]["dst"] != "0.0.0.0/0" || p.IPAM.Routes[1]["dst"] != "::/0" {
		t.Errorf("routes: %v", p.IPAM.Routes)
	}
	if !c.Plugins[1].Capabilities["portMappings"] {
		t.Errorf("portmap: %s", b)
	}
	if _, err := conf([]string{"not-a-cidr"}, 1500); err == nil {
		t.Error("a malformed podCIDR gave no error")
	}
}

// TestWriteConfOnlyWhenChanged: the file is rewritten only when the
// configuration changes (containerd re-reads it on every change).
func TestWriteConfOnlyWhenChanged(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "net.d")
	for i, tc := range []struct {
		cidr string
		want bool
	}{{"10.244.0.0/24", true}, {"10.244.0.0/24", false}, {"10.244.1.0/24", true}} {
		changed, err := writeConf(dir, []string{tc.cidr}, 1500)
		if err != nil {
			t.Fatal(err)
		}
		if changed != tc.want {
			t.Errorf("write %d (%s): changed %v, want %v", i, tc.cidr, changed, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, confName+".tmp")); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
}
