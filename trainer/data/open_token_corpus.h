// OpenTokenCorpus: the TokenCorpus (token_corpus.h) a --data path names.
// Kept apart from both sources so that neither depends on the other.
// Stateless; thread-safe.
#ifndef DYNMO_TRAINER_DATA_OPEN_TOKEN_CORPUS_H_
#define DYNMO_TRAINER_DATA_OPEN_TOKEN_CORPUS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "trainer/data/token_corpus.h"

namespace dynmo::trainer {

// `path` ending in .bin or .idx, or a prefix P with P.bin and P.idx present:
// an indexed dataset (indexed_dataset.h); any other existing file:
// byte-level text.
absl::StatusOr<std::unique_ptr<TokenCorpus>> OpenTokenCorpus(const std::string& path);

}  // namespace dynmo::trainer

#endif  // DYNMO_TRAINER_DATA_OPEN_TOKEN_CORPUS_H_
