package designrules

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestE2EDealTagsAreUnique: the e2e suite shares one kcp, and a deal's tag
// names its workspaces (<prefix>-<tag>-…): two tests with one tag collide
// ("workspace already exists") only when both run, as in CI's full run
// (TestKindTenant and TestMarketDealSurvivesProviderKills both used "k").
func TestE2EDealTagsAreUnique(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(root, "e2e", "*_test.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no e2e tests: %v", err)
	}
	call := regexp.MustCompile(`\b(?:newDeal|newDealAs|tenantDeal|tenantDealWith)\(ctx, t, "([^"]+)"`)
	seen := map[string]string{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			if other, ok := seen[m[1]]; ok {
				t.Errorf("deal tag %q is used by %s and %s: their workspaces collide", m[1], other, filepath.Base(f))
			}
			seen[m[1]] = filepath.Base(f)
		}
	}
	if len(seen) == 0 {
		t.Fatal("no deal tags found: the pattern no longer matches the e2e helpers")
	}
}
