package marketrequester

import (
	"testing"

	marketv1alpha1 "github.com/knotless-dev/knotless/apis/market/v1alpha1"
)

func TestAccessKeyNamesTheListInAnyOrder(t *testing.T) {
	a := []marketv1alpha1.TenantAccess{{DID: "did:plc:a", Role: marketv1alpha1.AccessView}, {DID: "did:plc:b", Role: marketv1alpha1.AccessEdit}}
	b := []marketv1alpha1.TenantAccess{a[1], a[0]}
	if accessKey(nil) != "" || accessKey(a) == "" || accessKey(a) != accessKey(b) {
		t.Fatalf("keys %q %q %q", accessKey(nil), accessKey(a), accessKey(b))
	}
	c := []marketv1alpha1.TenantAccess{{DID: "did:plc:a", Role: marketv1alpha1.AccessAdmin}, a[1]}
	if accessKey(a) == accessKey(c) {
		t.Fatal("another role has the same key")
	}
	for _, r := range accessRules(marketv1alpha1.AccessEdit) {
		for _, v := range r.Verbs {
			if v == "*" || v == "impersonate" || v == "bind" || v == "escalate" {
				t.Fatalf("edit has %q", v)
			}
		}
	}
}
