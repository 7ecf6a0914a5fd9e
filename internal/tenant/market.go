package tenant

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	computev1alpha1 "github.com/knotless-dev/knotless/apis/compute/v1alpha1"
	"github.com/knotless-dev/knotless/internal/conditions"
	"github.com/knotless-dev/knotless/internal/mount"
)

// MarketNamespace is the namespace of the provider's workspace that holds
// the credentials of market contracts' mounts (a TenantCluster with
// spec.credential.market): the provider alone writes them, the mount
// proxy reads them, and no user of a workspace the provider serves can.
const MarketNamespace = "knotless-mounts"

// LabelMarketCluster is the label of a market credential naming the
// logical cluster of its TenantCluster (LabelMountCredential names the
// TenantCluster), by which the mount proxy maps a change of it to the
// TenantCluster.
const LabelMarketCluster = "compute.knotless.dev/logical-cluster"

// Data keys of a market credential beside token, url, ca.crt and the
// principals: the logical cluster and the TenantCluster it is for, which
// reading checks against the name it was found by.
const (
	marketClusterKey  = "logical-cluster"
	marketNameKey     = "tenantcluster"
	marketContractKey = "contract-uid"
	marketExpiresKey  = "expires"
)

// MarketCredential is what the provider keeps for the mount of a market
// contract (of UID Contract): the TenantCluster Name of logical cluster
// LogicalCluster, at URL and verified by CA, is reached with Token,
// which expires at Expires, asserting Users and Groups alone
// (mount.Tenant.Impersonate).
type MarketCredential struct {
	LogicalCluster, Name, Contract, URL string
	CA                                  []byte
	Token                               string
	Users, Groups                       []string
	Expires                             time.Time
}

// MarketSecretName is the name of the Secret of MarketNamespace that holds
// the credential of the TenantCluster name of the logical cluster lc.
func MarketSecretName(lc, name string) string {
	sum := sha256.Sum256([]byte(lc + "/" + name))
	return "mount-" + hex.EncodeToString(sum[:16])
}

// Secret is the credential as a Secret of the provider's workspace.
func (m MarketCredential) Secret() *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: MarketNamespace, Name: MarketSecretName(m.LogicalCluster, m.Name),
			Labels: map[string]string{LabelMarketCluster: m.LogicalCluster, computev1alpha1.LabelMountCredential: m.Name}},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			"token": []byte(m.Token), computev1alpha1.MountCredentialURLKey: []byte(m.URL), computev1alpha1.MountCredentialCAKey: m.CA,
			computev1alpha1.MountCredentialUsersKey: []byte(strings.Join(m.Users, "\n")), computev1alpha1.MountCredentialGroupsKey: []byte(strings.Join(m.Groups, "\n")),
			marketClusterKey: []byte(m.LogicalCluster), marketNameKey: []byte(m.Name), marketContractKey: []byte(m.Contract),
			marketExpiresKey: []byte(m.Expires.UTC().Format(time.RFC3339)),
		},
	}
}

// ReadMarket reads the credential the provider keeps for the TenantCluster
// name of the logical cluster lc from its workspace (c), and whether there
// is one: a Secret that says it is for another TenantCluster is none.
func ReadMarket(ctx context.Context, c client.Reader, lc, name string) (MarketCredential, bool, error) {
	s := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: MarketNamespace, Name: MarketSecretName(lc, name)}, s); err != nil {
		if apierrors.IsNotFound(err) {
			return MarketCredential{}, false, nil
		}
		return MarketCredential{}, false, err
	}
	if d := s.Data; string(d[marketClusterKey]) != lc || string(d[marketNameKey]) != name || len(d["token"]) == 0 {
		return MarketCredential{}, false, nil
	}
	return marketOf(s), true, nil
}

// marketOf is the credential a Secret of MarketNamespace holds.
func marketOf(s *corev1.Secret) MarketCredential {
	d := s.Data
	exp, _ := time.Parse(time.RFC3339, string(d[marketExpiresKey]))
	return MarketCredential{LogicalCluster: string(d[marketClusterKey]), Name: string(d[marketNameKey]), Contract: string(d[marketContractKey]),
		URL: string(d[computev1alpha1.MountCredentialURLKey]), CA: d[computev1alpha1.MountCredentialCAKey], Token: string(d["token"]),
		Users: lines(d[computev1alpha1.MountCredentialUsersKey]), Groups: lines(d[computev1alpha1.MountCredentialGroupsKey]), Expires: exp}
}

// DeleteMarket deletes the credential the provider keeps for the
// TenantCluster name of the logical cluster lc, when it is the one of
// the contract of UID contract (another contract of that name, in
// another namespace of the workspace, does not delete it).
func DeleteMarket(ctx context.Context, c client.Client, lc, name, contract string) error {
	s := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: MarketNamespace, Name: MarketSecretName(lc, name)}, s); err != nil {
		return client.IgnoreNotFound(err)
	}
	if string(s.Data[marketContractKey]) != contract {
		return nil
	}
	return client.IgnoreNotFound(c.Delete(ctx, s, client.Preconditions{UID: &s.UID, ResourceVersion: &s.ResourceVersion}))
}

// SweepMarket deletes the credentials of MarketNamespace whose token
// expired more than grace before now: a contract or workspace that went
// without the market ending its mount leaves its credential behind,
// which no mount can use once its token has expired. It returns how many
// it deleted.
func SweepMarket(ctx context.Context, c client.Client, now time.Time, grace time.Duration) (int, error) {
	var secs corev1.SecretList
	if err := c.List(ctx, &secs, client.InNamespace(MarketNamespace)); err != nil {
		return 0, err
	}
	n := 0
	for i := range secs.Items {
		s := &secs.Items[i]
		if exp := marketOf(s).Expires; exp.IsZero() || exp.Add(grace).After(now) {
			continue
		}
		if err := c.Delete(ctx, s, client.Preconditions{UID: &s.UID, ResourceVersion: &s.ResourceVersion}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return n, err
		}
		n++
	}
	return n, nil
}

// resolveMarket completes t, the tenant of tc (a market contract's mount)
// verified by the CA bundle pemCA of spec.caBundle, with the credential
// the provider keeps for it (read through market, the provider's
// workspace; nil reads none): it must be for spec.url and that CA bundle.
// A missing credential, one for another URL and one bound to another CA
// are one refusal, so a TenantCluster learns nothing of the provider's.
func resolveMarket(ctx context.Context, market client.Reader, t mount.Tenant, tc *computev1alpha1.TenantCluster, pemCA []byte) (mount.Tenant, error) {
	refused := conditions.Errorf(computev1alpha1.ReasonCredentialNotFound, nil, "the provider keeps no credential for this TenantCluster at spec.url with spec.caBundle (only a market contract's mount has one)")
	if market == nil {
		return t, refused
	}
	mc, ok, err := ReadMarket(ctx, market, t.LogicalCluster, tc.Name)
	switch {
	case err != nil:
		return t, err
	case !ok || mc.URL != tc.Spec.URL || !sameCertificates(pemCA, mc.CA):
		return t, refused
	}
	t.Credential.Token = mc.Token
	t.Impersonate = &mount.Principals{Users: mc.Users, Groups: mc.Groups}
	return t, nil
}

// sameCertificates says whether two PEM bundles hold the same
// certificates (at least one), in any order.
func sameCertificates(pemA, pemB []byte) bool {
	a, b := certificates(pemA), certificates(pemB)
	if len(a) == 0 || len(a) != len(b) {
		return false
	}
	slices.SortFunc(a, bytes.Compare)
	slices.SortFunc(b, bytes.Compare)
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}
