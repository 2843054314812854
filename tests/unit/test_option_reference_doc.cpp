// docs/configuration.md's option reference is the option table's, word for word: a new, renamed
// or re-documented option fails this test until the page follows (scripts/update-option-reference.sh).
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "dstrain/core/option_reference.h"
#include "dstrain/train/train_config.h"

using namespace dstrain;

TEST(ConfigurationDoc, OptionReferenceMatchesTheOptionTable) {
  std::ifstream in(std::string(DSTRAIN_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(in.good()) << "cannot read docs/configuration.md";
  std::stringstream text;
  text << in.rdbuf();
  const std::string in_readme = option_reference_in(text.str());
  ASSERT_FALSE(in_readme.empty()) << "docs/configuration.md lacks the option reference markers";
  const std::string expected = option_reference_markdown(train_option_table());
  EXPECT_EQ(in_readme, expected) << "docs/configuration.md's option reference differs from the options; "
                                    "run scripts/update-option-reference.sh";
}

TEST(ConfigurationDoc, ReferenceListsEveryOptionWithDefaultAndMeaning) {
  const OptionTable table = train_option_table();
  const std::string reference = option_reference_markdown(table);
  for (const OptionSpec& spec : table.specs()) {
    const size_t at = reference.find("| `" + spec.key + "` |");
    ASSERT_NE(at, std::string::npos) << spec.key;
    const std::string row = reference.substr(at, reference.find('\n', at) - at);
    if (!spec.default_value.empty()) EXPECT_NE(row.find("`" + spec.default_value + "`"), std::string::npos) << row;
    EXPECT_NE(row.find(spec.help.substr(0, 20)), std::string::npos) << row;
  }
}

TEST(ConfigurationDoc, MarkersDelimitTheReference) {
  EXPECT_EQ(option_reference_in("a\n<!-- BEGIN option reference -->\nx\ny\n<!-- END option reference -->\nb"), "x\ny\n");
  EXPECT_EQ(option_reference_in("no markers"), "");
}
